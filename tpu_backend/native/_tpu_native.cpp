// The tpu device's compiled dispatch path: what a PrivateUse1 backend needs per op that
// involves no JAX, done in C++ instead of through a C++ -> Python crossing.
//
// - the device guard (PyTorch asks it for the current device and stream several times per
//   op and per autograd node; the Python guard answers each through a Python call);
// - the view kernels (`as_strided`, `view`, `_reshape_alias`, `unfold`): a new TensorImpl
//   over the SAME storage, so it shares the storage's JAX payload (tpu_backend/tensor.py).
//   `transpose`, `permute`, `expand`, `select`, `slice`, `t`... reach `as_strided`;
// - `flatten_args`: an op's torch arguments -> (dynamic JAX values, static template), the
//   per-argument work of every recorded (fused) or jitted (strict) op. Only the common case
//   is here (a tensor that is its storage's whole payload, ints, floats, lists of those);
//   everything else is handed to the Python functions it replaces
//   (tpu_backend/eager/arguments.py), so there is one definition of the semantics.
// - the op kernels: each table op's functional kernel, in front of its Python kernel. A
//   call the Python kernel has run (and taught it) goes straight into the op's jitted
//   lowering (strict mode) or `fused.record` (fused mode); results are wrapped here.
// - fused mode's `record` (`fused_record`): the steps of `fused.python_record` (input
//   wiring, trie edge, node, placeholders) without a Python frame per op.
//
// The lowerings, the payload table and fused mode's sync point stay in Python. Loaded by
// tpu_backend/native/__init__.py; TPU_NATIVE=0 keeps the pure-Python path.

#include <Python.h>
#include <structmember.h>  // PyMemberDef: where LazyArray's slots live

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------------ device guard

// One device, index 0 (several chips are used through JAX sharding, not tpu:1), one
// stream: JAX runs a device's work in issue order (tpu_backend/streams.py).
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kTpu, 0); }
  c10::Device getDevice() const override { return c10::Device(kTpu, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, 0));
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, 0));
  }
  // As the Python guard answers: every stream is the one queue; events are recorded and
  // waited for by tpu_backend/streams.py (in Python), so here they are no-ops that are done.
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, 0));
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

TpuGuardImpl guard_impl;
std::unique_ptr<c10::impl::DeviceGuardImplRegistrar> guard_registrar;

// ------------------------------------------------------------------------ view kernels

// A view: a new TensorImpl over the same storage (hence the same payload), with the
// source's dispatch keys (math bits included), as ATen's own view kernels make one.
at::Tensor make_view(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset) {
  TORCH_CHECK(size.size() == stride.size(), "mismatch in length of strides and shape");
  for (auto s : stride) {
    TORCH_CHECK(s >= 0, "as_strided: Negative strides are not supported at the moment, got strides: ", stride);
  }
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(self.storage()), self.key_set(), self.dtype());
  impl->set_sizes_and_strides(size, stride, offset);
  return at::Tensor(std::move(impl));
}

at::Tensor tpu_as_strided(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride,
    std::optional<c10::SymInt> storage_offset) {
  int64_t offset = storage_offset.has_value() ? storage_offset->expect_int() : self.storage_offset();
  return make_view(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor tpu_view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor tpu_reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor tpu_unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

std::unique_ptr<torch::Library> view_library;

// ------------------------------------------------------------------------ flatten_args

// Set by `configure`: the payload table and the Python functions the slow cases go to.
PyObject* payloads = nullptr;       // tensor._PAYLOADS: storage key -> StoragePayload
PyObject* slots = nullptr;          // arguments._SLOTS: a list, slot i at index i
PyObject* slot_fn = nullptr;        // arguments._slot(i): grows _SLOTS
PyObject* tensor_fn = nullptr;      // arguments._tensor(value, dynamic, defer_views) -> template item
PyObject* flatten_fn = nullptr;     // arguments._flatten(value, dynamic, dynamic_floats, defer_views)
PyObject* str_array = nullptr;
PyObject* str_dtype = nullptr;
PyObject* str_shape = nullptr;

PyObject* storage_key_of(const at::Tensor& t) {
  return PyLong_FromVoidPtr(t.storage().unsafeGetStorageImpl());
}

// New reference to the template slot of dynamic value `index`.
PyObject* slot(Py_ssize_t index) {
  if (index < PyList_GET_SIZE(slots)) {
    PyObject* found = PyList_GET_ITEM(slots, index);
    Py_INCREF(found);
    return found;
  }
  return PyObject_CallFunction(slot_fn, "n", index);
}

// 1 when `shape` (a tuple of ints) equals `sizes`, 0 when not, -1 on error.
int same_shape(PyObject* shape, c10::IntArrayRef sizes) {
  if (!PyTuple_Check(shape)) {
    return 0;
  }
  if (PyTuple_GET_SIZE(shape) != static_cast<Py_ssize_t>(sizes.size())) {
    return 0;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (value == -1 && PyErr_Occurred()) {
      return -1;
    }
    if (value != sizes[i]) {
      return 0;
    }
  }
  return 1;
}

// A StoragePayload's slots (`numel`, `dtype`, `array`, `key`, `ref`), read and written at
// their offsets (found once from the class's member descriptors) instead of through
// attribute lookups: the op kernels touch two or three per tensor per call.
enum PayloadSlot { kNumel, kPayloadDtype, kArray, kKey, kPayloadRef, kPayloadSlots };
PyTypeObject* payload_slots_type = nullptr;  // the class the offsets are of (nullptr: not found yet)
Py_ssize_t payload_offsets[kPayloadSlots] = {};
PyObject* payload_slot_names[kPayloadSlots] = {};

bool payload_has_slots(PyObject* payload) {
  PyTypeObject* kind = Py_TYPE(payload);
  if (kind == payload_slots_type) {
    return true;
  }
  if (payload_slots_type != nullptr || payload_slot_names[0] == nullptr) {
    return false;
  }
  Py_ssize_t offsets[kPayloadSlots];
  for (int i = 0; i < kPayloadSlots; ++i) {
    PyObject* member = PyDict_GetItem(kind->tp_dict, payload_slot_names[i]);  // borrowed
    if (member == nullptr || Py_TYPE(member) != &PyMemberDescr_Type ||
        reinterpret_cast<PyMemberDescrObject*>(member)->d_member->type != T_OBJECT_EX) {
      return false;
    }
    offsets[i] = reinterpret_cast<PyMemberDescrObject*>(member)->d_member->offset;
  }
  std::copy(offsets, offsets + kPayloadSlots, payload_offsets);
  Py_INCREF(kind);
  payload_slots_type = kind;
  return true;
}

// payload.<slot> as a new reference (nullptr with AttributeError when unset).
PyObject* payload_get(PyObject* payload, PayloadSlot slot) {
  if (payload_has_slots(payload)) {
    PyObject* value = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(payload) + payload_offsets[slot]);
    if (value == nullptr) {
      PyErr_SetObject(PyExc_AttributeError, payload_slot_names[slot]);
      return nullptr;
    }
    return Py_NewRef(value);
  }
  return PyObject_GetAttr(payload, payload_slot_names[slot]);
}

// payload.<slot> = value; 0, or -1 with an error set.
int payload_set(PyObject* payload, PayloadSlot slot, PyObject* value) {
  if (payload_has_slots(payload)) {
    PyObject** where = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(payload) + payload_offsets[slot]);
    PyObject* old = *where;
    *where = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
  }
  return PyObject_SetAttr(payload, payload_slot_names[slot], value);
}

PyObject* array_type = nullptr;  // jax's ArrayImpl (set by configure_kernels)
PyObject* str_aval = nullptr;

// (shape, dtype) of a JAX array or a fused placeholder, as new references. A JAX array's
// `shape` and `dtype` are Python properties over its `aval` (a plain object): read there.
bool array_meta(PyObject* array, PyObject** shape, PyObject** dtype) {
  PyObject* source = array;
  PyObject* aval = nullptr;
  if (array_type != nullptr && reinterpret_cast<PyObject*>(Py_TYPE(array)) == array_type) {
    aval = PyObject_GetAttr(array, str_aval);
    if (aval == nullptr) {
      return false;
    }
    source = aval;
  }
  *shape = PyObject_GetAttr(source, str_shape);
  *dtype = *shape ? PyObject_GetAttr(source, str_dtype) : nullptr;
  Py_XDECREF(aval);
  if (*dtype == nullptr) {
    Py_CLEAR(*shape);
    return false;
  }
  return true;
}

// The storage's array when tensor `t` reads as it with no work (the hot path of
// `tensor.read` and `tensor.read_deferred`): borrowed from `payload`... as a new reference,
// or nullptr with no error set when the slow path must decide.
PyObject* whole_storage_array(const at::Tensor& t, PyObject* payload) {
  if (t.storage_offset() != 0 || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
    return nullptr;
  }
  PyObject* dtype = payload_get(payload, kPayloadDtype);
  if (dtype == nullptr) {
    return nullptr;
  }
  bool same_dtype = dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  Py_DECREF(dtype);
  if (!same_dtype) {
    return nullptr;
  }
  PyObject* array = payload_get(payload, kArray);
  if (array == nullptr) {
    return nullptr;
  }
  if (array == Py_None) {
    Py_DECREF(array);
    return nullptr;
  }
  PyObject *shape = nullptr, *array_dtype = nullptr;
  if (!array_meta(array, &shape, &array_dtype)) {
    Py_DECREF(array);
    return nullptr;
  }
  int same = same_shape(shape, t.sizes());
  Py_DECREF(shape);
  Py_DECREF(array_dtype);
  if (same != 1) {
    Py_DECREF(array);
    return nullptr;
  }
  return array;
}

PyObject* flatten_value(PyObject* value, PyObject* dynamic, bool dynamic_floats, PyObject* defer_views);

// A tensor argument: its array appended to `dynamic`; returns its template item.
PyObject* flatten_tensor(PyObject* value, PyObject* dynamic, PyObject* defer_views) {
  const at::Tensor& t = THPVariable_Unpack(value);
  PyObject* key = storage_key_of(t);
  if (key == nullptr) {
    return nullptr;
  }
  PyObject* payload = PyDict_GetItemWithError(payloads, key);  // borrowed
  Py_DECREF(key);
  if (payload != nullptr) {
    PyObject* array = whole_storage_array(t, payload);
    if (array != nullptr) {
      int failed = PyList_Append(dynamic, array);
      Py_DECREF(array);
      return failed ? nullptr : slot(PyList_GET_SIZE(dynamic) - 1);
    }
  }
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return PyObject_CallFunctionObjArgs(tensor_fn, value, dynamic, defer_views, nullptr);
}

PyObject* flatten_sequence(PyObject* value, PyObject* dynamic, bool dynamic_floats, PyObject* defer_views) {
  PyObject* items = PySequence_Fast(value, "expected a sequence");
  if (items == nullptr) {
    return nullptr;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  PyObject* out = PyTuple_New(n);
  if (out == nullptr) {
    Py_DECREF(items);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = flatten_value(PySequence_Fast_GET_ITEM(items, i), dynamic, dynamic_floats, defer_views);
    if (item == nullptr) {
      Py_DECREF(items);
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i, item);
  }
  Py_DECREF(items);
  return out;
}

// `arguments._flatten` for one value, the common kinds in C++ (in its order of checks).
PyObject* flatten_value(PyObject* value, PyObject* dynamic, bool dynamic_floats, PyObject* defer_views) {
  if (THPVariable_Check(value)) {
    return flatten_tensor(value, dynamic, defer_views);
  }
  PyTypeObject* kind = Py_TYPE(value);
  if (kind == &PyLong_Type || kind == &PyBool_Type || value == Py_None) {
    Py_INCREF(value);
    return value;
  }
  if (kind == &PyFloat_Type) {
    if (!dynamic_floats) {
      Py_INCREF(value);
      return value;
    }
    if (PyList_Append(dynamic, value)) {
      return nullptr;
    }
    return slot(PyList_GET_SIZE(dynamic) - 1);
  }
  if (kind == &PyList_Type || kind == &PyTuple_Type) {
    return flatten_sequence(value, dynamic, dynamic_floats, defer_views);
  }
  return PyObject_CallFunctionObjArgs(
      flatten_fn, value, dynamic, dynamic_floats ? Py_True : Py_False, defer_views, nullptr);
}

// flatten_args(args: tuple, kwargs: dict, dynamic_floats=True, defer_views=True)
//   -> (dynamic: list, template_args: tuple, template_kwargs: tuple of (name, item))
PyObject* py_flatten_args(PyObject*, PyObject* const* argv, Py_ssize_t argc, PyObject* kwnames) {
  PyObject* given[4] = {nullptr, nullptr, Py_True, Py_True};
  Py_ssize_t positional = PyVectorcall_NARGS(argc);
  Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  if (positional < 2 || positional > 4) {
    PyErr_SetString(PyExc_TypeError, "flatten_args(args, kwargs, dynamic_floats=True, defer_views=True)");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < positional; ++i) {
    given[i] = argv[i];
  }
  for (Py_ssize_t i = 0; i < keywords; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    int index = PyUnicode_CompareWithASCIIString(name, "dynamic_floats") == 0 ? 2
        : PyUnicode_CompareWithASCIIString(name, "defer_views") == 0      ? 3
                                                                          : -1;
    if (index < 0) {
      PyErr_Format(PyExc_TypeError, "flatten_args() got an unexpected keyword argument %R", name);
      return nullptr;
    }
    given[index] = argv[positional + i];
  }
  if (payloads == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "tpu native: configure() was not called");
    return nullptr;
  }
  PyObject* args = given[0];
  PyObject* kwargs = given[1];
  int floats_flag = PyObject_IsTrue(given[2]);
  int views_flag = PyObject_IsTrue(given[3]);
  if (floats_flag < 0 || views_flag < 0) {
    return nullptr;
  }
  bool dynamic_floats = floats_flag;
  PyObject* defer_views = views_flag ? Py_True : Py_False;
  PyObject* dynamic = PyList_New(0);
  if (dynamic == nullptr) {
    return nullptr;
  }
  PyObject* template_args = flatten_sequence(args, dynamic, dynamic_floats, defer_views);
  if (template_args == nullptr) {
    Py_DECREF(dynamic);
    return nullptr;
  }
  PyObject* template_kwargs = nullptr;
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    Py_DECREF(dynamic);
    Py_DECREF(template_args);
    PyErr_SetString(PyExc_TypeError, "flatten_args: kwargs must be a dict");
    return nullptr;
  }
  Py_ssize_t n = kwargs == Py_None ? 0 : PyDict_Size(kwargs);
  template_kwargs = PyTuple_New(n);
  if (template_kwargs == nullptr) {
    Py_DECREF(dynamic);
    Py_DECREF(template_args);
    return nullptr;
  }
  Py_ssize_t position = 0, i = 0;
  PyObject *name, *value;
  while (n && PyDict_Next(kwargs, &position, &name, &value)) {
    PyObject* item = flatten_value(value, dynamic, dynamic_floats, defer_views);
    if (item == nullptr) {
      Py_DECREF(dynamic);
      Py_DECREF(template_args);
      Py_DECREF(template_kwargs);
      return nullptr;
    }
    PyTuple_SET_ITEM(template_kwargs, i++, PyTuple_Pack(2, name, item));
    Py_DECREF(item);
  }
  PyObject* result = PyTuple_Pack(3, dynamic, template_args, template_kwargs);
  Py_DECREF(dynamic);
  Py_DECREF(template_args);
  Py_DECREF(template_kwargs);
  return result;
}

// ------------------------------------------------------------------------ write

PyObject* python_write = nullptr;  // tensor.write as defined in Python (every case but the hot one)
PyObject* str_value = nullptr;
PyObject* str_ref = nullptr;
PyObject* str_weak_type = nullptr;

// 1 when `a` and `b` are equal shape tuples (or the same object), 0 when not, -1 on error.
int same_tuple(PyObject* a, PyObject* b) {
  if (a == b) {
    return 1;
  }
  return PyObject_RichCompareBool(a, b, Py_EQ);
}

// tensor.write's hot path (in-place ops, optimizer updates: a value just like the tensor's
// whole storage): true when `value` was stored as `t`'s payload here; false (no error set)
// when the Python definition must decide.
bool write_whole(const at::Tensor& t, PyObject* value) {
  if (payloads == nullptr || t.storage_offset() != 0 || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
    return false;
  }
  PyObject* key = storage_key_of(t);
  PyObject* payload = key ? PyDict_GetItemWithError(payloads, key) : nullptr;  // borrowed
  Py_XDECREF(key);
  PyObject* base = payload ? payload_get(payload, kArray) : nullptr;
  int decided = 0;  // 1: written here, -1: error
  if (base != nullptr && base != Py_None) {
    PyObject* payload_dtype = payload_get(payload, kPayloadDtype);
    PyObject *base_shape = nullptr, *base_dtype = nullptr, *value_shape = nullptr, *value_dtype = nullptr;
    if (payload_dtype && array_meta(base, &base_shape, &base_dtype) && array_meta(value, &value_shape, &value_dtype)) {
      int same = payload_dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
      if (same == 1) {
        same = same_tuple(value_dtype, base_dtype);
      }
      if (same == 1) {
        same = same_tuple(value_shape, base_shape);
      }
      if (same == 1) {
        same = same_shape(base_shape, t.sizes());
      }
      if (same == 1) {
        decided = payload_set(payload, kArray, value) == 0 ? 1 : -1;
      }
    }
    Py_XDECREF(payload_dtype);
    Py_XDECREF(base_dtype);
    Py_XDECREF(value_dtype);
    Py_XDECREF(base_shape);
    Py_XDECREF(value_shape);
  }
  Py_XDECREF(base);
  if (PyErr_Occurred()) {
    PyErr_Clear();  // the Python definition decides what the error is
    decided = 0;
  }
  return decided == 1;
}

// tensor.write(t, value): the hot path here, every other case in Python.
PyObject* py_write(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || python_write == nullptr) {
    PyErr_SetString(PyExc_TypeError, "write(t, value), after configure_write()");
    return nullptr;
  }
  if (THPVariable_Check(argv[0]) && write_whole(THPVariable_Unpack(argv[0]), argv[1])) {
    Py_RETURN_NONE;
  }
  return PyObject_Vectorcall(python_write, argv, 2, nullptr);
}

// tensor.write(t, value) for a C++ tensor: the hot path, else the Python definition.
bool write_tensor(const at::Tensor& t, PyObject* value) {
  if (write_whole(t, value)) {
    return true;
  }
  PyObject* wrapped = THPVariable_Wrap(t);
  PyObject* done = wrapped ? PyObject_CallFunctionObjArgs(python_write, wrapped, value, nullptr) : nullptr;
  Py_XDECREF(wrapped);
  Py_XDECREF(done);
  return done != nullptr;
}

bool device_tensor(const at::Tensor& t);

PyObject* py_configure_write(PyObject*, PyObject* fn) {
  Py_INCREF(fn);
  Py_XSETREF(python_write, fn);
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------ copy_

// `copy_` between two tpu tensors whose source reads as its storage's whole array (a
// parameter, an optimizer's state): the source's array written into the destination
// (`tensor.write`: its hot case here, casting, broadcasting and views in Python). Anything
// else (host <-> device, a view as the source, math bits) is core_ops.copy_'s, registered
// behind this kernel on PrivateUse2.
struct CopyKernel final : public c10::OperatorKernel {
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    size_t n = op.schema().arguments().size();
    if (n == 3 && stack->size() >= 3) {
      const c10::IValue& dst_value = (*stack)[stack->size() - 3];
      const c10::IValue& src_value = (*stack)[stack->size() - 2];
      if (dst_value.isTensor() && src_value.isTensor() && device_tensor(dst_value.toTensor()) &&
          device_tensor(src_value.toTensor())) {
        at::Tensor dst = dst_value.toTensor();
        const at::Tensor& src = src_value.toTensor();
        PyGILState_STATE gil = PyGILState_Ensure();
        PyObject* array = nullptr;
        if (payloads != nullptr && python_write != nullptr) {
          PyObject* key = storage_key_of(src);
          PyObject* payload = key ? PyDict_GetItemWithError(payloads, key) : nullptr;  // borrowed
          Py_XDECREF(key);
          array = payload ? whole_storage_array(src, payload) : nullptr;
        }
        PyErr_Clear();
        if (array != nullptr) {
          bool written = write_tensor(dst, array);
          Py_DECREF(array);
          if (!written) {
            python_error error;
            error.persist();
            PyGILState_Release(gil);
            throw error;
          }
          PyGILState_Release(gil);
          torch::jit::drop(*stack, n);
          stack->push_back(std::move(dst));
          return;
        }
        PyGILState_Release(gil);
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
  }
};

std::unique_ptr<torch::Library> copy_library;

PyObject* py_install_copy_kernel(PyObject*, PyObject*) {
  try {
    if (!copy_library) {
      copy_library = std::make_unique<torch::Library>(
          torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
      copy_library->impl("copy_", torch::CppFunction::makeFromBoxedFunctor(std::make_unique<CopyKernel>()));
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------ fused recording

// fused._Graph.input_ref(value) for one input; a new reference, or nullptr on error.
PyObject* input_ref(PyObject* value, PyObject* floats, PyObject* external, PyObject* external_index, PyObject* lazy_type) {
  PyObject* computed = nullptr;  // a placeholder's value once its graph has run
  if (reinterpret_cast<PyObject*>(Py_TYPE(value)) == lazy_type) {
    computed = PyObject_GetAttr(value, str_value);
    if (computed == nullptr) {
      return nullptr;
    }
    if (computed == Py_None) {
      Py_DECREF(computed);
      return PyObject_GetAttr(value, str_ref);  // pending: wired to the node that makes it
    }
    value = computed;
  }
  PyObject* ref = nullptr;
  if (Py_TYPE(value) == &PyFloat_Type) {
    if (PyList_Append(floats, value) == 0) {
      ref = Py_BuildValue("(sn)", "f", PyList_GET_SIZE(floats) - 1);
    }
    Py_XDECREF(computed);
    return ref;
  }
  PyObject* identity = PyLong_FromVoidPtr(value);
  PyObject* found = identity ? PyDict_GetItemWithError(external_index, identity) : nullptr;  // borrowed
  if (found != nullptr) {
    ref = Py_NewRef(found);
  } else if (identity != nullptr && !PyErr_Occurred()) {
    // A JAX array's shape, dtype and weak_type are Python properties returning its aval's:
    // read the aval (a C++ property) once instead of running three Python frames.
    PyObject* aval = nullptr;
    if (array_type != nullptr && reinterpret_cast<PyObject*>(Py_TYPE(value)) == array_type) {
      aval = PyObject_GetAttr(value, str_aval);
    }
    PyObject* source = aval != nullptr ? aval : value;
    PyObject* shape = PyErr_Occurred() ? nullptr : PyObject_GetAttr(source, str_shape);
    PyObject* dtype = shape ? PyObject_GetAttr(source, str_dtype) : nullptr;
    PyObject* weak = nullptr;
    if (dtype != nullptr) {
      weak = PyObject_GetAttr(source, str_weak_type);  // getattr(value, "weak_type", False)
      if (weak == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        weak = Py_NewRef(Py_False);
      }
    }
    Py_XDECREF(aval);
    if (weak != nullptr) {
      ref = Py_BuildValue("(snOOO)", "x", PyList_GET_SIZE(external), shape, dtype, weak);
      if (ref != nullptr &&
          (PyDict_SetItem(external_index, identity, ref) != 0 || PyList_Append(external, value) != 0)) {
        Py_CLEAR(ref);
      }
    }
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(weak);
  }
  Py_XDECREF(identity);
  Py_XDECREF(computed);
  return ref;
}

// input_refs(inputs, floats, external, external_index, LazyArray) -> tuple of refs
PyObject* py_input_refs(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5) {
    PyErr_SetString(PyExc_TypeError, "input_refs(inputs, floats, external, external_index, LazyArray)");
    return nullptr;
  }
  PyObject* items = PySequence_Fast(argv[0], "inputs must be a sequence");
  if (items == nullptr) {
    return nullptr;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  PyObject* refs = PyTuple_New(n);
  for (Py_ssize_t i = 0; refs != nullptr && i < n; ++i) {
    PyObject* ref = input_ref(PySequence_Fast_GET_ITEM(items, i), argv[1], argv[2], argv[3], argv[4]);
    if (ref == nullptr) {
      Py_CLEAR(refs);
      break;
    }
    PyTuple_SET_ITEM(refs, i, ref);
  }
  Py_DECREF(items);
  return refs;
}

// fused.record in C++ (`record` below); `configure_fused` hands it the module. The Python
// `record` is the definition; this is the same steps without a Python frame per op (and
// the op kernels call it without building an argument list).
PyObject* fused_globals = nullptr;  // tpu_backend.fused.__dict__ (`_graph`, `_lock`, ...)
PyTypeObject* placeholder_type = nullptr;  // fused.LazyArray
PyObject* python_follow = nullptr;  // fused._follow: a trie edge not seen before
// where LazyArray's slots live in an instance: written directly into a fresh object
enum PlaceholderSlot { kShape, kDtype, kWeakType, kRef, kValue, kSlots };
Py_ssize_t placeholder_offsets[kSlots] = {};
PyObject* str_graph = nullptr;
PyObject* str_lock = nullptr;
PyObject* str_acquire = nullptr;
PyObject* str_release = nullptr;
PyObject* str_max_nodes = nullptr;
PyObject* str_sync = nullptr;
PyObject* str_node_limit = nullptr;
PyObject* str_n = nullptr;
PyObject* str_floats = nullptr;
PyObject* str_external = nullptr;
PyObject* str_external_index = nullptr;
PyObject* str_state = nullptr;
PyObject* str_children = nullptr;
PyObject* str_nodes = nullptr;
PyObject* str_placeholders = nullptr;

// configure_fused(fused.__dict__): what `record` needs (after LazyArray and _follow exist).
PyObject* py_configure_fused(PyObject*, PyObject* globals) {
  if (!PyDict_Check(globals)) {
    PyErr_SetString(PyExc_TypeError, "configure_fused(fused.__dict__)");
    return nullptr;
  }
  PyObject* type = PyDict_GetItemString(globals, "LazyArray");  // borrowed
  PyObject* follow = PyDict_GetItemString(globals, "_follow");
  if (type == nullptr || !PyType_Check(type) || follow == nullptr) {
    PyErr_SetString(PyExc_TypeError, "configure_fused: the module has no LazyArray class or _follow");
    return nullptr;
  }
  const char* names[kSlots] = {"shape", "dtype", "weak_type", "ref", "value"};
  PyObject* type_dict = reinterpret_cast<PyTypeObject*>(type)->tp_dict;
  for (int i = 0; i < kSlots; ++i) {
    PyObject* member = PyDict_GetItemString(type_dict, names[i]);
    if (member == nullptr || Py_TYPE(member) != &PyMemberDescr_Type) {
      PyErr_Format(PyExc_TypeError, "configure_fused: LazyArray.%s is not a slot", names[i]);
      return nullptr;
    }
    placeholder_offsets[i] = reinterpret_cast<PyMemberDescrObject*>(member)->d_member->offset;
  }
  Py_INCREF(globals);
  Py_XSETREF(fused_globals, globals);
  Py_INCREF(type);
  Py_XSETREF(placeholder_type, reinterpret_cast<PyTypeObject*>(type));
  Py_INCREF(follow);
  Py_XSETREF(python_follow, follow);
  PyObject* array_impl = PyDict_GetItemString(globals, "_ARRAY_IMPL");  // input_ref reads its aval
  if (array_impl != nullptr && array_type == nullptr) {
    array_type = Py_NewRef(array_impl);
  }
  Py_RETURN_NONE;
}

// LazyArray(aval, ref) without its __init__: aval is (shape, dtype, weak_type).
PyObject* new_placeholder(PyObject* aval, PyObject* ref) {
  if (!PyTuple_Check(aval) || PyTuple_GET_SIZE(aval) != 3) {
    PyErr_SetString(PyExc_TypeError, "fused: an output aval is not (shape, dtype, weak_type)");
    return nullptr;
  }
  PyObject* placeholder = placeholder_type->tp_alloc(placeholder_type, 0);
  if (placeholder == nullptr) {
    return nullptr;
  }
  PyObject* values[kSlots] = {
      PyTuple_GET_ITEM(aval, 0), PyTuple_GET_ITEM(aval, 1), PyTuple_GET_ITEM(aval, 2), ref, Py_None};
  for (int i = 0; i < kSlots; ++i) {
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(placeholder) + placeholder_offsets[i]) =
        Py_NewRef(values[i]);
  }
  return placeholder;
}

// A new reference to attribute `name` of `owner`, released by the holder.
struct Attr {
  PyObject* value;
  Attr(PyObject* owner, PyObject* name) : value(owner ? PyObject_GetAttr(owner, name) : nullptr) {}
  ~Attr() { Py_XDECREF(value); }
  operator PyObject*() const { return value; }
};

// The node's function result structure from its placeholders: the edge's `pack` (None: a
// bare array; tuple, list: a flat sequence; else a treedef's unflatten).
PyObject* pack_results(PyObject* pack, PyObject* results) {
  if (pack == Py_None) {
    if (PyList_GET_SIZE(results) != 1) {
      PyErr_SetString(PyExc_TypeError, "fused: a single-array edge with several outputs");
      return nullptr;
    }
    return Py_NewRef(PyList_GET_ITEM(results, 0));
  }
  if (pack == reinterpret_cast<PyObject*>(&PyTuple_Type)) {
    return PyList_AsTuple(results);
  }
  if (pack == reinterpret_cast<PyObject*>(&PyList_Type)) {
    return Py_NewRef(results);
  }
  return PyObject_CallOneArg(pack, results);
}

PyObject* list_of(PyObject* const* items, Py_ssize_t n) {
  PyObject* list = PyList_New(n);
  for (Py_ssize_t i = 0; list != nullptr && i < n; ++i) {
    PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
  }
  return list;
}

// fused.record's body, `_lock` held; sets *full when the graph reached its node limit.
PyObject* record_locked(PyObject* key, PyObject* fn, PyObject* const* inputs, Py_ssize_t n, bool* full) {
  PyObject* graph = PyDict_GetItemWithError(fused_globals, str_graph);  // borrowed (the lock keeps it)
  if (graph == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "fused: no graph");
    }
    return nullptr;
  }
  Attr floats(graph, str_floats), external(graph, str_external), external_index(graph, str_external_index);
  if (floats == nullptr || external == nullptr || external_index == nullptr) {
    return nullptr;
  }
  PyObject* refs = PyTuple_New(n);
  for (Py_ssize_t i = 0; refs != nullptr && i < n; ++i) {
    PyObject* ref = input_ref(inputs[i], floats, external, external_index, reinterpret_cast<PyObject*>(placeholder_type));
    if (ref == nullptr) {
      Py_CLEAR(refs);
      break;
    }
    PyTuple_SET_ITEM(refs, i, ref);
  }
  if (refs == nullptr) {
    return nullptr;
  }
  // the trie edge (key, refs) from the graph's state; `_follow` adds one not seen before
  Attr state(graph, str_state);
  Attr children(state, str_children);
  PyObject* edge_key = children ? PyTuple_Pack(2, key, refs) : nullptr;
  PyObject* edge = edge_key ? PyDict_GetItemWithError(children, edge_key) : nullptr;  // borrowed
  Py_XDECREF(edge_key);
  if (edge != nullptr) {
    Py_INCREF(edge);
  } else if (children != nullptr && !PyErr_Occurred()) {
    PyObject* listed = list_of(inputs, n);
    edge = listed ? PyObject_CallFunctionObjArgs(python_follow, graph, key, fn, listed, refs, nullptr) : nullptr;
    Py_XDECREF(listed);
  }
  PyObject* out = nullptr;
  PyObject* results = nullptr;
  if (edge != nullptr && (!PyTuple_Check(edge) || PyTuple_GET_SIZE(edge) != 3 ||
                          !PyTuple_Check(PyTuple_GET_ITEM(edge, 1)))) {
    PyErr_SetString(PyExc_TypeError, "fused: a trie edge is not (state, avals, pack)");
  } else if (edge != nullptr && PyObject_SetAttr(graph, str_state, PyTuple_GET_ITEM(edge, 0)) == 0) {
    Attr nodes(graph, str_nodes), placeholders(graph, str_placeholders);
    PyObject* avals = PyTuple_GET_ITEM(edge, 1);
    PyObject* pack = PyTuple_GET_ITEM(edge, 2);
    Py_ssize_t count = PyTuple_GET_SIZE(avals);
    Py_ssize_t position = nodes && PyList_Check(nodes) ? PyList_GET_SIZE(nodes.value) : -1;
    PyObject* where = position >= 0 && placeholders && PyList_Check(placeholders) ? PyLong_FromSsize_t(position) : nullptr;
    results = where ? PyList_New(count) : nullptr;
    for (Py_ssize_t i = 0; results != nullptr && i < count; ++i) {
      PyObject* index = PyLong_FromSsize_t(i);
      PyObject* ref = index ? PyTuple_Pack(3, str_n, where, index) : nullptr;
      PyObject* placeholder = ref ? new_placeholder(PyTuple_GET_ITEM(avals, i), ref) : nullptr;
      Py_XDECREF(index);
      Py_XDECREF(ref);
      if (placeholder == nullptr) {
        Py_CLEAR(results);
        break;
      }
      PyList_SET_ITEM(results, i, placeholder);
    }
    Py_XDECREF(where);
    PyObject* node = results ? PyTuple_Pack(3, key, fn, refs) : nullptr;
    bool added = node != nullptr && PyList_Append(nodes, node) == 0;
    Py_XDECREF(node);
    if (added) {
      Py_ssize_t total = PyList_GET_SIZE(placeholders.value);
      added = PyList_SetSlice(placeholders, total, total, results) == 0;  // graph.placeholders += results
    }
    if (added) {
      out = pack_results(pack, results);
    }
    PyObject* limit = out ? PyDict_GetItemWithError(fused_globals, str_max_nodes) : nullptr;  // borrowed
    if (limit != nullptr) {
      long long most = PyLong_AsLongLong(limit);
      *full = most >= 0 && position + 1 >= most;
    }
    if (PyErr_Occurred()) {
      Py_CLEAR(out);
    }
  }
  Py_XDECREF(results);
  Py_XDECREF(edge);
  Py_DECREF(refs);
  return out;
}

// fused.record(key, fn, inputs) for `inputs` as a C array: under fused._lock, then the
// node-limit sync.
PyObject* fused_record(PyObject* key, PyObject* fn, PyObject* const* inputs, Py_ssize_t n) {
  if (fused_globals == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "fused.record: configure_fused was not called");
    return nullptr;
  }
  PyObject* lock = PyDict_GetItemWithError(fused_globals, str_lock);  // borrowed
  PyObject* held = lock ? PyObject_CallMethodNoArgs(lock, str_acquire) : nullptr;
  if (held == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, "fused: no _lock");
    }
    return nullptr;
  }
  Py_DECREF(held);
  Py_INCREF(lock);
  bool full = false;
  PyObject* out = record_locked(key, fn, inputs, n, &full);
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // releasing must not lose the error
  PyObject* released = PyObject_CallMethodNoArgs(lock, str_release);
  Py_DECREF(lock);
  if (released == nullptr) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    Py_XDECREF(out);
    return nullptr;
  }
  Py_DECREF(released);
  PyErr_Restore(type, value, traceback);
  if (out != nullptr && full) {
    PyObject* sync = PyDict_GetItemWithError(fused_globals, str_sync);  // borrowed
    PyObject* synced = sync ? PyObject_CallOneArg(sync, str_node_limit) : nullptr;
    if (synced == nullptr) {
      Py_CLEAR(out);
    }
    Py_XDECREF(synced);
  }
  return out;
}

// record(key, fn, inputs) -> the placeholders, as fused.record returns them.
PyObject* py_fused_record(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3) {
    PyErr_SetString(PyExc_TypeError, "record(key, fn, inputs)");
    return nullptr;
  }
  PyObject* items = PySequence_Fast(argv[2], "record: inputs must be a sequence");
  if (items == nullptr) {
    return nullptr;
  }
  PyObject* out = fused_record(argv[0], argv[1], PySequence_Fast_ITEMS(items), PySequence_Fast_GET_SIZE(items));
  Py_DECREF(items);
  return out;
}

// ------------------------------------------------------------------------ fused sync point

// The per-array loops of fused.sync, each the same steps as the Python function it names
// (the definition, run with TPU_NATIVE=0). A reference count here is Py_REFCNT: an
// object held only by its list counts 1 (sys.getrefcount adds its argument and the loop's
// variable, hence fused._HELD_ONLY_BY_THE_LIST = 2 and _HELD_ONLY_BY_THE_GRAPH = 3).

PyObject* tuple_of_indices(const std::vector<Py_ssize_t>& indices) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(indices.size()));
  for (size_t i = 0; out != nullptr && i < indices.size(); ++i) {
    PyObject* index = PyLong_FromSsize_t(indices[i]);
    if (index == nullptr) {
      Py_CLEAR(out);
      break;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), index);
  }
  return out;
}

// live_outputs(placeholders) -> fused._live_outputs: the positions of the placeholders
// something besides the list holds.
PyObject* py_live_outputs(PyObject*, PyObject* placeholders) {
  if (!PyList_Check(placeholders)) {
    PyErr_SetString(PyExc_TypeError, "live_outputs(placeholders: list)");
    return nullptr;
  }
  std::vector<Py_ssize_t> live;
  Py_ssize_t n = PyList_GET_SIZE(placeholders);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (Py_REFCNT(PyList_GET_ITEM(placeholders, i)) > 1) {
      live.push_back(i);
    }
  }
  return tuple_of_indices(live);
}

// donated(ArrayImpl, jax.Array, external, external_kinds, reusable) -> fused._donated:
// the external inputs held only by the list that are JAX arrays, as many per kind (a
// numbered (shape, dtype)) as `reusable` counts (a copy is counted down).
PyObject* py_donated(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5 || !PyList_Check(argv[2]) || !PyList_Check(argv[3]) || !PyList_Check(argv[4])) {
    PyErr_SetString(PyExc_TypeError, "donated(ArrayImpl, jax.Array, external: list, external_kinds: list, reusable: list)");
    return nullptr;
  }
  PyObject *array_impl = argv[0], *array_class = argv[1];
  PyObject *external = argv[2], *kinds = argv[3], *reusable = argv[4];
  std::vector<Py_ssize_t> left;  // reusable's copy, made for the first candidate
  bool copied = false;
  std::vector<Py_ssize_t> donated;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(external); ++i) {
    PyObject* value = PyList_GET_ITEM(external, i);
    if (Py_REFCNT(value) > 1) {
      continue;
    }
    if (reinterpret_cast<PyObject*>(Py_TYPE(value)) != array_impl) {
      Py_INCREF(value);  // isinstance may run Python code
      int is_array = PyObject_IsInstance(value, array_class);
      Py_DECREF(value);
      if (is_array < 0) {
        return nullptr;
      }
      if (is_array == 0) {
        continue;
      }
    }
    if (!copied) {
      copied = true;
      for (Py_ssize_t k = 0; k < PyList_GET_SIZE(reusable); ++k) {
        left.push_back(PyLong_AsSsize_t(PyList_GET_ITEM(reusable, k)));
      }
      if (PyErr_Occurred()) {
        return nullptr;
      }
    }
    PyObject* kind_object = PyList_GetItem(kinds, i);  // borrowed; IndexError as in Python
    Py_ssize_t kind = kind_object ? PyLong_AsSsize_t(kind_object) : -1;
    if (kind < 0 || kind >= static_cast<Py_ssize_t>(left.size())) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_IndexError, "donated: a kind out of reusable's range");
      }
      return nullptr;
    }
    if (left[kind] > 0) {
      --left[kind];
      donated.push_back(i);
    }
  }
  return tuple_of_indices(donated);
}

// replace_computed_payloads(payloads, LazyValue) -> tensor.replace_computed_payloads: each
// payload holding a pending value holds its computed array. A computed placeholder's
// `value` is read from its slot; any other LazyValue is asked to `force()`.
PyObject* py_replace_computed_payloads(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !PyDict_Check(argv[0])) {
    PyErr_SetString(PyExc_TypeError, "replace_computed_payloads(payloads: dict, LazyValue)");
    return nullptr;
  }
  PyObject* everything = PyDict_Values(argv[0]);  // a snapshot: force() may run Python code
  if (everything == nullptr) {
    return nullptr;
  }
  bool failed = false;
  for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(everything); ++i) {
    PyObject* payload = PyList_GET_ITEM(everything, i);
    PyObject* array = payload_get(payload, kArray);
    if (array == nullptr) {
      failed = true;
      break;
    }
    PyObject* computed = nullptr;
    if (array == Py_None || reinterpret_cast<PyObject*>(Py_TYPE(array)) == array_type) {
      Py_DECREF(array);  // unmaterialised, or a concrete JAX array: nothing to replace
      continue;
    }
    if (placeholder_type != nullptr && Py_TYPE(array) == placeholder_type) {
      PyObject* value = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(array) + placeholder_offsets[kValue]);
      if (value != nullptr && value != Py_None) {
        computed = Py_NewRef(value);
      }
    }
    if (computed == nullptr) {
      int pending = PyObject_IsInstance(array, argv[1]);
      failed = pending < 0;
      if (pending == 1) {
        computed = PyObject_CallMethod(array, "force", nullptr);
        failed = computed == nullptr;
      }
    }
    if (computed != nullptr) {
      failed = payload_set(payload, kArray, computed) != 0;
      Py_DECREF(computed);
    }
    Py_DECREF(array);
  }
  Py_DECREF(everything);
  if (failed) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

// split_arrays(array_types, numpy.ndarray, args) -> compile.program._split: (the arrays
// among args, their weak types, (position, type, value) of every other argument).
PyObject* py_split_arrays(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3 || !PyTuple_Check(argv[0]) || !PyTuple_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "split_arrays(array_types: tuple, ndarray, args: tuple)");
    return nullptr;
  }
  PyObject *array_types = argv[0], *ndarray = argv[1], *args = argv[2];
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* arrays = PyList_New(0);
  PyObject* weak = PyList_New(0);
  PyObject* statics = PyList_New(0);
  bool failed = arrays == nullptr || weak == nullptr || statics == nullptr;
  for (Py_ssize_t i = 0; !failed && i < n; ++i) {
    PyObject* value = PyTuple_GET_ITEM(args, i);
    PyObject* kind = reinterpret_cast<PyObject*>(Py_TYPE(value));
    bool is_array = false;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(array_types); ++t) {
      is_array = is_array || PyTuple_GET_ITEM(array_types, t) == kind;
    }
    if (is_array || kind == ndarray) {
      PyObject* weak_type = nullptr;
      if (is_array) {  // a.aval.weak_type
        PyObject* aval = PyObject_GetAttr(value, str_aval);
        weak_type = aval ? PyObject_GetAttr(aval, str_weak_type) : nullptr;
        Py_XDECREF(aval);
      } else {  // fused mode's vector of Python floats
        weak_type = Py_NewRef(Py_False);
      }
      failed = weak_type == nullptr || PyList_Append(arrays, value) != 0 || PyList_Append(weak, weak_type) != 0;
      Py_XDECREF(weak_type);
    } else {
      PyObject* item = Py_BuildValue("(nOO)", i, kind, value);
      failed = item == nullptr || PyList_Append(statics, item) != 0;
      Py_XDECREF(item);
    }
  }
  PyObject* out = nullptr;
  if (!failed) {
    PyObject* weak_tuple = PyList_AsTuple(weak);
    PyObject* statics_tuple = weak_tuple ? PyList_AsTuple(statics) : nullptr;
    out = statics_tuple ? PyTuple_Pack(3, arrays, weak_tuple, statics_tuple) : nullptr;
    Py_XDECREF(weak_tuple);
    Py_XDECREF(statics_tuple);
  }
  Py_XDECREF(arrays);
  Py_XDECREF(weak);
  Py_XDECREF(statics);
  return out;
}

// ------------------------------------------------------------------------ op kernels

// The PrivateUse1 kernel of a table op (its functional overload), in front of the Python
// kernel (tpu_backend/eager/registration.py), which is registered on PrivateUse2 and
// reached by redispatch. A call takes the C++ path when it is one the Python kernel has
// already run through its hot path: strict mode calls the op's jitted lowering (JAX's
// own C++ fast path) on the arguments' payload arrays, fused mode records the bound
// lowering (`fused.record`); either way the results are wrapped into tensors here. So a
// warm op costs no Python frame of ours and no argument conversion to Python objects.
//
// What "already run" means: the call's *key* (op, the static values of its arguments,
// where its tensors and floats are) was seen by the Python kernel, which then `learn`s
// the jitted function (or the fused (OpKey, bound function)) for it. The key determines
// the Python kernel's static template (`arguments.flatten_args`), because the Python
// arguments are a function of the boxed ones; only tensors that are their storage's
// whole payload take this path (views, CPU scalars, unmaterialised payloads: Python).
// Everything else (misses, debug mode, rng and host ops, errors) is the Python kernel's.

struct OpEntry {
  long id = 0;
  c10::FunctionSchema schema;
  size_t kwarg_only_start;  // the first keyword-only argument (they go as kwargs): from the schema
  size_t returns = 0;  // the number of Tensor results (0: the op's results are not all plain tensors)
  bool dynamic_floats = true;  // the runner's: floats are dynamic values (else static, in the key)
  bool list_result = false;  // one Tensor[] result (the functional `_foreach_*` ops)
  // An in-place op (`add_`, `_foreach_mul_`): its functional op's runner computes it (and
  // learns the calls), the result is written into `self` here (`finish`: the Python kernel's
  // tail, registration._write_inplace, for every case but the hot one).
  OpEntry* functional = nullptr;
  PyObject* finish = nullptr;
  std::vector<OpEntry*> inplace_entries;  // of a functional entry: they forget when it does
  std::unordered_map<std::string, PyObject*> strict;  // key -> jitted lowering (a reference)
  std::unordered_map<std::string, PyObject*> fused;  // key -> (OpKey, bound lowering) (a reference)
  // of an in-place entry: key -> the jitted lowering that donates self's arrays (a reference;
  // runner.OpRunner._donating), run when nothing else can read them (`donatable_self`)
  std::unordered_map<std::string, PyObject*> donating;
  // ... and the dtypes of self for which its results were not self's (`int_tensor.mul_(0.5)`)
  std::unordered_map<std::string, std::vector<c10::ScalarType>> donation_refused;

  explicit OpEntry(c10::FunctionSchema s) : schema(std::move(s)) {
    kwarg_only_start = schema.arguments().size();
    while (kwarg_only_start > 0 && schema.arguments()[kwarg_only_start - 1].kwarg_only()) {
      --kwarg_only_start;
    }
  }

  bool floats_dynamic() const { return functional != nullptr ? functional->dynamic_floats : dynamic_floats; }

  void forget() {
    for (OpEntry* other : inplace_entries) {
      other->forget();
    }
    for (auto* table : {&strict, &fused, &donating}) {
      for (auto& item : *table) {
        Py_DECREF(item.second);
      }
      table->clear();
    }
    donation_refused.clear();
  }
};

std::vector<std::unique_ptr<OpEntry>> op_entries;
std::map<std::string, std::unique_ptr<torch::Library>> op_libraries;  // namespace -> IMPL library

// Set by `configure_kernels`.
PyObject* modes_dict = nullptr;  // tpu_backend.eager.modes.__dict__ (its `_mode`)
PyObject* tensor_dict = nullptr;  // tpu_backend.tensor.__dict__ (SYNC_EACH_COMPUTATION)
PyObject* fused_module = nullptr;  // tpu_backend.fused (`record`, looked up per call: benchmarks wrap it)
PyObject* runner_module = nullptr;  // tpu_backend.eager.runner (`_run_jitted`, same)
PyObject* original_run_jitted = nullptr;
PyObject* compiles_class = nullptr;  // runner._Compiles: `started` is set when a jitted call traced
PyObject* note_compile_fn = nullptr;  // runner._note_native_compile(): counts the compile
PyObject* cpu_to_jax_fn = nullptr;  // tensor.cpu_to_jax: a CPU scalar tensor's value as a JAX array
PyObject* wrap_outputs_fn = nullptr;  // registration._wrap_outputs: results that are not plain arrays
PyObject* torch_dtype_fn = nullptr;  // ops.registry.torch_dtype(numpy dtype) -> torch.dtype
PyObject* payload_type = nullptr;  // tensor.StoragePayload
PyObject* lazy_type = nullptr;  // fused.LazyArray
c10::Allocator* device_allocator = nullptr;  // the allocator of the device's (zero-byte) storages
PyObject* str_mode = nullptr;
PyObject* str_strict = nullptr;
PyObject* str_fused = nullptr;
PyObject* str_sync_each = nullptr;
PyObject* str_record = nullptr;
PyObject* str_run_jitted = nullptr;
PyObject* str_started = nullptr;
PyObject* str_numel = nullptr;
PyObject* str_key = nullptr;
long long native_requests = 0;  // strict calls made here (runner.CACHE_STATS adds them)
long long native_hits = 0;  // ... of which did not compile

// The call the Python kernel is running for a C++ kernel that did not know it (per thread:
// autograd's device thread runs the backward).
struct Pending {
  OpEntry* entry = nullptr;
  std::string key;
  bool fused = false;
  bool dynamic_floats = true;
};
thread_local Pending pending;

enum class Mode { kOther, kStrict, kFused };

Mode current_mode() {
  PyObject* mode = PyDict_GetItemWithError(modes_dict, str_mode);  // borrowed
  if (mode == nullptr) {
    PyErr_Clear();
    return Mode::kOther;
  }
  if (mode == str_strict || (PyUnicode_Check(mode) && PyUnicode_Compare(mode, str_strict) == 0)) {
    PyObject* sync_each = PyDict_GetItemWithError(tensor_dict, str_sync_each);
    if (sync_each == nullptr || sync_each != Py_False) {  // multi-process CPU runs: the Python path waits
      PyErr_Clear();
      return Mode::kOther;
    }
    return Mode::kStrict;
  }
  if (mode == str_fused || (PyUnicode_Check(mode) && PyUnicode_Compare(mode, str_fused) == 0)) {
    return Mode::kFused;
  }
  PyErr_Clear();
  return Mode::kOther;
}

template <typename T>
void append_raw(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The payload array of tpu tensor `t` (a new reference) and whether `t` reads as all of it
// (`whole`; otherwise the op's program gathers `t` from it), or nullptr (no error set) when
// the Python kernel must read it (no payload, unmaterialised, re-typed): the cases of
// `tensor.read_deferred`.
PyObject* payload_array(const at::Tensor& t, bool* whole) {
  PyObject* key = storage_key_of(t);
  if (key == nullptr) {
    return nullptr;
  }
  PyObject* payload = PyDict_GetItemWithError(payloads, key);  // borrowed
  Py_DECREF(key);
  if (payload == nullptr) {
    return nullptr;
  }
  PyObject* dtype = payload_get(payload, kPayloadDtype);
  bool same_dtype = dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  Py_XDECREF(dtype);
  if (!same_dtype) {
    return nullptr;
  }
  PyObject* array = payload_get(payload, kArray);
  if (array == nullptr || array == Py_None) {
    Py_XDECREF(array);
    return nullptr;
  }
  *whole = false;
  if (t.storage_offset() == 0 && t.is_contiguous()) {
    PyObject *shape = nullptr, *array_dtype = nullptr;
    if (!array_meta(array, &shape, &array_dtype)) {
      Py_DECREF(array);
      return nullptr;
    }
    int same = same_shape(shape, t.sizes());
    Py_DECREF(shape);
    Py_DECREF(array_dtype);
    if (same < 0) {
      Py_DECREF(array);
      return nullptr;
    }
    *whole = same == 1;
  }
  return array;
}

// A tensor argument that can take the C++ path: a tpu tensor with no math bits (the
// Python kernel resolves those).
bool device_tensor(const at::Tensor& t) {
  return t.defined() && t.key_set().has(c10::DispatchKey::PrivateUse1) && !t.is_conj() && !t.is_neg();
}

// whole_arrays(args, slots, general) -> (values, payloads): compiled_graph._read_inputs
// without a Python step per input (a 1B Llama's decode step reads ~245). Argument i whose
// slot is not None and that is a tpu tensor reading as all of its payload's JAX array (no
// offset, contiguous, that array's shape and dtype, no math bits) gives the array and the
// payload; any other argument gives general(arg) and None.
PyObject* py_whole_arrays(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3 || !PyList_Check(argv[0]) || !PyList_Check(argv[1]) ||
      PyList_GET_SIZE(argv[0]) != PyList_GET_SIZE(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "whole_arrays(args: list, slots: list of the same length, general)");
    return nullptr;
  }
  PyObject *args = argv[0], *arg_slots = argv[1], *general = argv[2];
  Py_ssize_t n = PyList_GET_SIZE(args);
  PyObject* values = PyList_New(n);
  PyObject* owners = values ? PyList_New(n) : nullptr;
  for (Py_ssize_t i = 0; owners != nullptr && i < n; ++i) {
    PyObject* arg = PyList_GET_ITEM(args, i);
    PyObject *value = nullptr, *payload = Py_None;
    if (payloads != nullptr && PyList_GET_ITEM(arg_slots, i) != Py_None && THPVariable_Check(arg)) {
      const at::Tensor& t = THPVariable_Unpack(arg);
      if (device_tensor(t)) {
        PyObject* key = storage_key_of(t);
        PyObject* found = key ? PyDict_GetItemWithError(payloads, key) : nullptr;  // borrowed
        Py_XDECREF(key);
        bool whole = false;
        PyObject* array = found ? payload_array(t, &whole) : nullptr;
        if (array != nullptr && whole && reinterpret_cast<PyObject*>(Py_TYPE(array)) == array_type) {
          value = array;
          payload = found;
        } else {
          Py_XDECREF(array);
        }
      }
    }
    if (value == nullptr && !PyErr_Occurred()) {
      value = PyObject_CallOneArg(general, arg);
    }
    if (value == nullptr) {
      Py_CLEAR(owners);
      break;
    }
    PyList_SET_ITEM(values, i, value);
    PyList_SET_ITEM(owners, i, Py_NewRef(payload));
  }
  PyObject* out = owners ? PyTuple_Pack(2, values, owners) : nullptr;
  Py_XDECREF(values);
  Py_XDECREF(owners);
  return out;
}

// The dynamic values of a call (new references), in the order `flatten_args` makes them.
struct Values {
  std::vector<PyObject*> items;
  ~Values() {
    for (PyObject* item : items) {
      Py_DECREF(item);
    }
  }
};

// A CPU scalar tensor (`x * 0.5` passes one) as `arguments._non_tpu_tensor` takes it: a JAX
// array of its value (`tensor.cpu_to_jax`), kept per (dtype, value): they repeat every step.
std::map<std::pair<int, std::string>, PyObject*> cpu_scalars;  // -> JAX array (a reference)
constexpr size_t kMaxCpuScalars = 512;

bool add_cpu_scalar(const at::Tensor& t, std::string& key, Values& inputs) {
  if (t.is_conj() || t.is_neg() || t.is_complex() || t.requires_grad()) {
    return false;
  }
  std::string bytes(static_cast<const char*>(t.const_data_ptr()), t.element_size());
  auto cache_key = std::make_pair(static_cast<int>(t.scalar_type()), bytes);
  auto found = cpu_scalars.find(cache_key);
  PyObject* array = nullptr;
  if (found != cpu_scalars.end()) {
    array = found->second;
  } else {
    PyObject* wrapped = THPVariable_Wrap(t);
    array = wrapped ? PyObject_CallOneArg(cpu_to_jax_fn, wrapped) : nullptr;
    Py_XDECREF(wrapped);
    if (array == nullptr) {
      return false;
    }
    if (cpu_scalars.size() >= kMaxCpuScalars) {
      for (auto& item : cpu_scalars) {
        Py_DECREF(item.second);
      }
      cpu_scalars.clear();
    }
    cpu_scalars.emplace(cache_key, array);  // the map's reference
  }
  Py_INCREF(array);
  inputs.items.push_back(array);
  key.push_back('c');
  return true;
}

// A tensor's payload array into `inputs` and its part of the key: 'T' when it reads as
// the whole array, else 'V' and the view's geometry (the template's `_ViewSlot`: the op's
// program gathers it). False when the Python kernel must read it.
bool add_number(const c10::IValue& value, bool dynamic_floats, std::string& key, Values& inputs);

bool add_tensor(const at::Tensor& t, bool dynamic_floats, std::string& key, Values& inputs) {
  if (t.defined() && t.dim() == 0 && t.device().is_cpu()) {
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      // `x * 2` passes 2 as a "wrapped number" tensor, which the Python kernel receives as
      // the Python number (torch::jit::toPyObject): a static int or bool, a dynamic float
      switch (t.scalar_type()) {
        case c10::ScalarType::Long:
          return add_number(c10::IValue(*t.const_data_ptr<int64_t>()), dynamic_floats, key, inputs);
        case c10::ScalarType::Double:
          return add_number(c10::IValue(*t.const_data_ptr<double>()), dynamic_floats, key, inputs);
        case c10::ScalarType::Bool:
          return add_number(c10::IValue(*t.const_data_ptr<bool>()), dynamic_floats, key, inputs);
        default:
          return false;
      }
    }
    return add_cpu_scalar(t, key, inputs);
  }
  if (!device_tensor(t)) {
    return false;
  }
  bool whole = false;
  PyObject* array = payload_array(t, &whole);
  if (array == nullptr) {
    return false;
  }
  inputs.items.push_back(array);
  if (whole) {
    key.push_back('T');
    return true;
  }
  key.push_back('V');
  append_raw(key, static_cast<int64_t>(t.dim()));
  for (int64_t size : t.sizes()) {
    append_raw(key, size);
  }
  for (int64_t stride : t.strides()) {
    append_raw(key, stride);
  }
  append_raw(key, static_cast<int64_t>(t.storage_offset()));
  return true;
}

// A Python number argument (bool, int: static; float: dynamic unless the op's floats are static).
bool add_number(const c10::IValue& value, bool dynamic_floats, std::string& key, Values& inputs) {
  if (value.isBool()) {
    key.push_back(value.toBool() ? 'B' : 'b');
  } else if (value.isInt()) {
    key.push_back('i');
    append_raw(key, value.toInt());
  } else if (value.isDouble()) {
    if (dynamic_floats) {
      PyObject* number = PyFloat_FromDouble(value.toDouble());
      if (number == nullptr) {
        return false;
      }
      key.push_back('d');
      inputs.items.push_back(number);
    } else {
      key.push_back('D');
      append_raw(key, value.toDouble());
    }
  } else {
    return false;
  }
  return true;
}

// Appends `value`'s part of the key; tensors' arrays and dynamic floats go to `inputs`.
// False (maybe with an error set): the call is not one for the C++ path.
bool key_of(const c10::IValue& value, bool dynamic_floats, std::string& key, Values& inputs) {
  if (value.isTensor()) {
    if (!add_tensor(value.toTensor(), dynamic_floats, key, inputs)) {
      return false;
    }
  } else if (value.isNone()) {
    key.push_back('n');
  } else if (value.isBool() || value.isInt() || value.isDouble()) {
    return add_number(value, dynamic_floats, key, inputs);
  } else if (value.isIntList()) {
    auto list = value.toIntList();
    key.push_back('l');
    append_raw(key, static_cast<int64_t>(list.size()));
    for (int64_t item : list) {
      append_raw(key, item);
    }
  } else if (value.isTensorList()) {
    c10::ArrayRef<c10::IValue> list = value.toListRef();
    key.push_back('L');
    append_raw(key, static_cast<int64_t>(list.size()));
    for (const c10::IValue& item : list) {
      if (!add_tensor(item.toTensor(), dynamic_floats, key, inputs)) {
        return false;
      }
    }
  } else if (value.isBoolList()) {
    auto list = value.toBoolList();
    key.push_back('k');
    append_raw(key, static_cast<int64_t>(list.size()));
    for (bool item : list) {
      key.push_back(item ? '1' : '0');
    }
  } else if (value.isDoubleList()) {
    auto list = value.toDoubleList();  // as in `_flatten`: each float a dynamic value (or static)
    key.push_back(dynamic_floats ? 'f' : 'F');
    append_raw(key, static_cast<int64_t>(list.size()));
    for (double item : list) {
      if (dynamic_floats) {
        PyObject* number = PyFloat_FromDouble(item);
        if (number == nullptr) {
          return false;
        }
        inputs.items.push_back(number);
      } else {
        append_raw(key, item);
      }
    }
  } else if (value.isList()) {
    // a Scalar[] (`_foreach_div_.ScalarList`): the Python kernel gets a list of numbers,
    // each flattened as a number is (a static int or bool, a dynamic float)
    c10::ArrayRef<c10::IValue> list = value.toListRef();
    key.push_back('g');
    append_raw(key, static_cast<int64_t>(list.size()));
    for (const c10::IValue& item : list) {
      if (!(item.isBool() || item.isInt() || item.isDouble()) || !add_number(item, dynamic_floats, key, inputs)) {
        return false;
      }
    }
  } else if (value.isString()) {
    auto text = value.toStringRef();
    key.push_back('s');
    append_raw(key, static_cast<int64_t>(text.size()));
    key.append(text);
  } else if (value.isDevice()) {
    auto device = value.toDevice();
    if (device.has_index() && device.index() != 0) {
      return false;  // the Python kernel says that tpu:N does not exist
    }
    if (device.type() != kTpu) {
      return false;  // empty_like(x, device="meta"): made on that device, by the Python kernel
    }
    key.push_back('v');
    append_raw(key, static_cast<int>(device.type()));
  } else {
    return false;  // generators, complex scalars, float lists, optional tensor lists...: Python
  }
  return true;
}

// The call's key, as `parseIValuesToPyArgsKwargs` presents the arguments to the Python
// kernel: trailing positional arguments equal to their defaults, and keyword-only ones
// equal to theirs, are left out (they are not in the Python kernel's template).
bool call_key(const OpEntry& entry, c10::ArrayRef<c10::IValue> args, std::string& key, Values& inputs) {
  const auto& schema_args = entry.schema.arguments();
  auto is_default = [&](size_t i) {
    const auto& fallback = schema_args[i].default_value();
    return fallback.has_value() && *fallback == args[i];
  };
  size_t positional = entry.kwarg_only_start;
  while (positional > 0 && is_default(positional - 1)) {
    --positional;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if ((i >= positional && i < entry.kwarg_only_start) || (i >= entry.kwarg_only_start && is_default(i))) {
      key.push_back('x');
      continue;
    }
    if (!key_of(args[i], entry.floats_dynamic(), key, inputs)) {
      return false;
    }
  }
  return true;
}

std::vector<std::pair<PyObject*, c10::ScalarType>> dtype_cache;  // numpy dtype (a reference) -> torch's

bool scalar_type_of(PyObject* dtype, c10::ScalarType* out) {
  for (auto& item : dtype_cache) {
    if (item.first == dtype) {
      *out = item.second;
      return true;
    }
  }
  PyObject* converted = PyObject_CallOneArg(torch_dtype_fn, dtype);
  if (converted == nullptr) {
    return false;
  }
  if (!THPDtype_Check(converted)) {
    Py_DECREF(converted);
    PyErr_SetString(PyExc_TypeError, "torch_dtype did not return a torch.dtype");
    return false;
  }
  *out = reinterpret_cast<THPDtype*>(converted)->scalar_type;
  Py_DECREF(converted);
  Py_INCREF(dtype);
  dtype_cache.emplace_back(dtype, *out);
  return true;
}

// A result's payload rides in its storage's DataPtr (the context: a reference to the
// StoragePayload) and this deleter releases it when the storage dies, doing
// `StoragePayload.release`'s work: no storage Python object, weakref or map entry per
// result. Storages die on autograd's worker threads too (hence the GIL), and after Python
// is finalizing the payload is left to the process's end.
void release_payload(void* context) {
#if PY_VERSION_HEX >= 0x030D0000
  bool finalizing = Py_IsFinalizing();
#else
  bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* payload = static_cast<PyObject*>(context);
  PyObject *error_type, *error, *trace;  // a tensor can die while an error is being raised
  PyErr_Fetch(&error_type, &error, &trace);
  PyObject* key = payload_get(payload, kKey);
  PyObject* current = key ? PyDict_GetItemWithError(payloads, key) : nullptr;  // borrowed
  if (current == payload) {
    PyDict_DelItem(payloads, key);
  }
  Py_XDECREF(key);
  if (payload_set(payload, kArray, Py_None) != 0 || payload_set(payload, kPayloadRef, Py_None) != 0) {
    PyErr_Clear();
  }
  Py_DECREF(payload);
  PyErr_Clear();  // nothing to report to
  PyErr_Restore(error_type, error, trace);
  PyGILState_Release(gil);
}

// `tensor.wrap(array)` in C++: a new contiguous tpu tensor whose storage's payload is `array`.
// An undefined tensor (with a Python error set) on failure.
at::Tensor wrap_array(PyObject* array) {
  PyObject *shape = nullptr, *dtype = nullptr;
  if (!array_meta(array, &shape, &dtype)) {
    return at::Tensor();
  }
  c10::ScalarType scalar_type;
  bool known = scalar_type_of(dtype, &scalar_type);
  std::vector<int64_t> sizes;
  if (known && PyTuple_Check(shape)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i) {
      sizes.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i)));
    }
  }
  Py_DECREF(shape);
  Py_DECREF(dtype);
  if (!known || PyErr_Occurred()) {
    return at::Tensor();
  }
  PyObject* payload = reinterpret_cast<PyTypeObject*>(payload_type)->tp_alloc(
      reinterpret_cast<PyTypeObject*>(payload_type), 0);
  if (payload == nullptr) {
    return at::Tensor();
  }
  // The DataPtr owns the payload reference from here: a failure below releases it with
  // the tensor (and drops the table entry if it was made).
  c10::DataPtr data(nullptr, payload, &release_payload, c10::Device(kTpu, 0));
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(data), device_allocator, true);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(scalar_type));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  // attached as tensor._attach does (keyed by storage), `ref` left None
  PyObject* numel = PyLong_FromLongLong(tensor.numel());
  PyObject* key = numel ? storage_key_of(tensor) : nullptr;
  bool ok = key != nullptr && payload_set(payload, kNumel, numel) == 0 &&
      payload_set(payload, kPayloadDtype, reinterpret_cast<PyObject*>(torch::getTHPDtype(scalar_type))) == 0 &&
      payload_set(payload, kArray, array) == 0 && payload_set(payload, kKey, key) == 0 &&
      payload_set(payload, kPayloadRef, Py_None) == 0 && PyDict_SetItem(payloads, key, payload) == 0;
  Py_XDECREF(key);
  Py_XDECREF(numel);
  return ok ? tensor : at::Tensor();
}

// Pushes the results of a lowering (`out`) as the op's results; false (error set) on failure.
bool push_results(const OpEntry& entry, PyObject* out, torch::jit::Stack* stack) {
  PyTypeObject* kind = Py_TYPE(out);
  if (entry.list_result) {  // the functional `_foreach_*` ops: a list of arrays, one Tensor[]
    if (kind != &PyTuple_Type && kind != &PyList_Type) {
      PyErr_SetString(PyExc_RuntimeError, "tpu native kernel: a Tensor[] op's lowering returned no sequence");
      return false;
    }
    c10::List<at::Tensor> results;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(out);
    results.reserve(count);
    for (Py_ssize_t i = 0; i < count; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(out, i);
      PyObject* item_type = reinterpret_cast<PyObject*>(Py_TYPE(item));
      at::Tensor t = item_type == array_type || item_type == lazy_type ? wrap_array(item) : at::Tensor();
      if (!t.defined()) {
        if (!PyErr_Occurred()) {
          PyErr_SetString(PyExc_RuntimeError, "tpu native kernel: a Tensor[] result that is not an array");
        }
        return false;
      }
      results.push_back(std::move(t));
    }
    stack->emplace_back(std::move(results));
    return true;
  }
  bool plain = reinterpret_cast<PyObject*>(kind) == array_type || reinterpret_cast<PyObject*>(kind) == lazy_type;
  if (plain && entry.returns == 1) {
    at::Tensor t = wrap_array(out);
    if (!t.defined()) {
      return false;
    }
    stack->emplace_back(std::move(t));
    return true;
  }
  if ((kind == &PyTuple_Type || kind == &PyList_Type) && entry.returns > 1 &&
      static_cast<size_t>(PySequence_Fast_GET_SIZE(out)) == entry.returns) {
    std::vector<at::Tensor> results;
    for (size_t i = 0; i < entry.returns; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(out, i);
      PyObject* item_type = reinterpret_cast<PyObject*>(Py_TYPE(item));
      if (item_type != array_type && item_type != lazy_type) {
        results.clear();
        break;
      }
      results.push_back(wrap_array(item));
      if (!results.back().defined()) {
        return false;
      }
    }
    if (!results.empty()) {
      for (auto& t : results) {
        stack->emplace_back(std::move(t));
      }
      return true;
    }
  }
  // anything else (None among the results...): the Python kernel's wrapping, then tensors
  PyObject* wrapped = PyObject_CallOneArg(wrap_outputs_fn, out);
  if (wrapped == nullptr) {
    return false;
  }
  std::vector<at::Tensor> results;
  if (entry.returns == 1 && THPVariable_Check(wrapped)) {
    results.push_back(THPVariable_Unpack(wrapped));
  } else if (PyTuple_Check(wrapped) && static_cast<size_t>(PyTuple_GET_SIZE(wrapped)) == entry.returns) {
    for (size_t i = 0; i < entry.returns; ++i) {
      PyObject* item = PyTuple_GET_ITEM(wrapped, i);
      if (!THPVariable_Check(item)) {
        break;
      }
      results.push_back(THPVariable_Unpack(item));
    }
  }
  Py_DECREF(wrapped);
  if (results.size() != entry.returns) {
    PyErr_SetString(PyExc_RuntimeError, "tpu native kernel: unexpected results");
    return false;
  }
  for (auto& t : results) {
    stack->emplace_back(std::move(t));
  }
  return true;
}

PyObject* as_list(PyObject** items, size_t count) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(count));
  for (size_t i = 0; list != nullptr && i < count; ++i) {
    Py_INCREF(items[i]);
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), items[i]);
  }
  return list;
}

// An in-place op's result `out` written into its `self` (a tensor or a Tensor[]), as the
// Python kernel does (tensor.write per tensor); what is not the plain case (another dtype:
// ATen's casting rule and its error; a result of another structure) goes to `finish`, the
// Python kernel's tail. False with a Python error set on failure.
bool finish_inplace(const OpEntry& entry, const c10::IValue& self, PyObject* out) {
  PyObject* kind = reinterpret_cast<PyObject*>(Py_TYPE(out));
  if (self.isTensor() && (kind == array_type || kind == lazy_type)) {
    const at::Tensor& t = self.toTensor();
    PyObject *shape = nullptr, *dtype = nullptr;
    c10::ScalarType result_type;
    if (!array_meta(out, &shape, &dtype)) {
      return false;
    }
    bool known = scalar_type_of(dtype, &result_type);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (!known) {
      return false;
    }
    if (result_type == t.scalar_type()) {
      return write_tensor(t, out);
    }
  } else if (self.isTensorList() && (PyList_Check(out) || PyTuple_Check(out))) {
    c10::ArrayRef<c10::IValue> list = self.toListRef();
    if (static_cast<size_t>(PySequence_Fast_GET_SIZE(out)) == list.size()) {
      for (size_t i = 0; i < list.size(); ++i) {
        if (!write_tensor(list[i].toTensor(), PySequence_Fast_GET_ITEM(out, static_cast<Py_ssize_t>(i)))) {
          return false;
        }
      }
      return true;
    }
  }
  PyObject* target = nullptr;
  if (self.isTensor()) {
    target = THPVariable_Wrap(self.toTensor());
  } else if (self.isTensorList()) {
    c10::ArrayRef<c10::IValue> list = self.toListRef();
    target = PyList_New(static_cast<Py_ssize_t>(list.size()));
    for (size_t i = 0; target != nullptr && i < list.size(); ++i) {
      PyObject* item = THPVariable_Wrap(list[i].toTensor());
      if (item == nullptr) {
        Py_CLEAR(target);
        break;
      }
      PyList_SET_ITEM(target, static_cast<Py_ssize_t>(i), item);
    }
  } else {
    PyErr_SetString(PyExc_TypeError, "tpu native kernel: an in-place op whose self is not a tensor");
  }
  PyObject* done = target ? PyObject_CallFunctionObjArgs(entry.finish, target, out, nullptr) : nullptr;
  Py_XDECREF(target);
  Py_XDECREF(done);
  return done != nullptr;
}

enum class Call { kPython, kDone, kError };

// The scalar type of an in-place call's self (of its first element for a Tensor[]).
c10::ScalarType self_scalar_type(const c10::IValue& self) {
  return self.isTensor() ? self.toTensor().scalar_type() : self.toListRef()[0].toTensor().scalar_type();
}

// Whether the key's donating lowering refused results for this dtype of self (its trace
// found results unlike self: a cast or ATen's casting error follows, nothing to donate).
bool donation_refused_for(const OpEntry& entry, const std::string& key, const c10::IValue& self) {
  auto found = entry.donation_refused.find(key);
  if (found == entry.donation_refused.end()) {
    return false;
  }
  auto type = self_scalar_type(self);
  return std::find(found->second.begin(), found->second.end(), type) != found->second.end();
}

void forget_donating(OpEntry& entry, const std::string& key) {
  auto found = entry.donating.find(key);
  if (found != entry.donating.end()) {
    Py_DECREF(found->second);
    entry.donating.erase(found);
  }
}

// Whether an in-place call's self arrays (the first dynamic values) can be donated: self is
// whole storage arrays ('T' in the key: a tensor, or every element of a Tensor[]) and each
// array is held by its payload and `inputs` alone (runner._unshared: not the user's
// `to_jax` value, not another storage's, not another argument of the call: `x.add_(x)`).
bool donatable_self(const c10::IValue& self, const std::string& key, const Values& inputs) {
  size_t count = 1, first = 0;  // self's arrays: inputs[0, count); its key: key[first, first + count)
  if (self.isTensorList()) {
    count = self.toListRef().size();
    first = 1 + sizeof(int64_t);  // 'L' and the length
  } else if (!self.isTensor()) {
    return false;
  }
  if (count == 0 || key.size() < first + count || inputs.items.size() < count) {
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    PyObject* array = inputs.items[i];
    if (key[first + i] != 'T' || reinterpret_cast<PyObject*>(Py_TYPE(array)) != array_type ||
        Py_REFCNT(array) != 2) {  // its payload and `inputs`
      return false;
    }
  }
  return true;
}

// The C++ path of one call: kPython (nothing consumed from the stack, no error set) when
// the Python kernel must run it, with `pending` set when it should learn the call; kError
// (a Python error set) when an in-place op's result could not be written (its lowering
// ran: running it again in Python would read half-written inputs).
Call run_known_call(OpEntry& entry, torch::jit::Stack* stack) {
  if (payloads == nullptr || modes_dict == nullptr) {
    return Call::kPython;
  }
  Mode mode = current_mode();
  if (mode == Mode::kOther || (entry.returns == 0 && !entry.list_result && entry.functional == nullptr)) {
    return Call::kPython;
  }
  size_t n = entry.schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  std::string key;
  key.reserve(64);
  Values inputs;
  inputs.items.reserve(8);
  if (!call_key(entry, args, key, inputs)) {
    PyErr_Clear();
    return Call::kPython;
  }
  auto& table = mode == Mode::kStrict ? entry.strict : entry.fused;
  auto found = table.find(key);
  if (found == table.end()) {
    pending.entry = &entry;
    pending.key = std::move(key);
    pending.fused = mode == Mode::kFused;
    pending.dynamic_floats = entry.floats_dynamic();
    return Call::kPython;
  }
  PyObject** dynamic = inputs.items.data();
  size_t count = inputs.items.size();
  PyObject* out = nullptr;
  bool donated = false;  // the call ran the key's donating lowering
  bool counted = false;  // the call counted in native_requests
  if (mode == Mode::kStrict) {
    PyObject* jitted = found->second;
    if (entry.functional != nullptr) {  // in-place: self's arrays donated when nothing else reads them
      auto donating = entry.donating.find(key);
      if (donating != entry.donating.end() && donatable_self(args[0], key, inputs) &&
          !donation_refused_for(entry, key, args[0])) {
        jitted = donating->second;
        donated = true;
      }
    }
    PyObject* run_jitted = PyObject_GetAttr(runner_module, str_run_jitted);
    if (run_jitted != nullptr && run_jitted != original_run_jitted) {
      // a wrapped `_run_jitted` (benchmarks/backend_bench.py --phases): it counts the call
      PyObject* listed = as_list(dynamic, count);
      out = listed ? PyObject_CallFunctionObjArgs(run_jitted, jitted, listed, nullptr) : nullptr;
      Py_XDECREF(listed);
    } else if (run_jitted != nullptr) {
      ++native_requests;
      counted = true;
      out = PyObject_Vectorcall(jitted, dynamic, count, nullptr);
      PyObject* started = out ? PyObject_GetAttr(compiles_class, str_started) : nullptr;
      if (started == Py_None) {
        ++native_hits;
      } else if (started != nullptr) {  // JAX traced (new shapes): counted as the Python path counts it
        PyObject* counted = PyObject_CallNoArgs(note_compile_fn);
        if (counted == nullptr) {
          Py_CLEAR(out);
        }
        Py_XDECREF(counted);
      }
      Py_XDECREF(started);
    }
    Py_XDECREF(run_jitted);
  } else {
    PyObject* record = PyObject_GetAttr(fused_module, str_record);
    PyObject* recorded = found->second;
    if (record != nullptr && PyCFunction_Check(record) &&
        PyCFunction_GET_FUNCTION(record) == reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_fused_record))) {
      // fused.record is the C++ one: called directly, no argument list
      out = fused_record(PyTuple_GET_ITEM(recorded, 0), PyTuple_GET_ITEM(recorded, 1), dynamic, count);
    } else {  // the Python one (TPU_NATIVE's record off), or one a benchmark wrapped
      PyObject* listed = record ? as_list(dynamic, count) : nullptr;
      if (listed != nullptr) {
        out = PyObject_CallFunctionObjArgs(
            record, PyTuple_GET_ITEM(recorded, 0), PyTuple_GET_ITEM(recorded, 1), listed, nullptr);
      }
      Py_XDECREF(listed);
    }
    Py_XDECREF(record);
  }
  if (out == nullptr) {
    // e.g. new dtypes the chip cannot compile: the Python kernel decides (and raises). A
    // donating lowering that failed (its trace refused results unlike self: nothing ran) is
    // not tried again for this key and self's dtype.
    if (donated) {
      native_requests -= counted ? 1 : 0;  // the Python kernel counts the call it makes instead
      entry.donation_refused[key].push_back(self_scalar_type(args[0]));
    }
    PyErr_Clear();
    if (mode == Mode::kStrict && PyObject_SetAttr(compiles_class, str_started, Py_None) != 0) {
      PyErr_Clear();  // a failed trace is not a compile
    }
    return Call::kPython;
  }
  if (entry.functional != nullptr) {  // in-place: the result written into self, self returned
    c10::IValue self = args[0];
    bool written = finish_inplace(entry, self, out);
    Py_DECREF(out);
    if (!written) {
      return Call::kError;
    }
    torch::jit::drop(*stack, n);
    if (self.isTensor() && entry.returns == 1) {
      stack->push_back(std::move(self));
    }
    return Call::kDone;
  }
  torch::jit::Stack produced;
  bool pushed = push_results(entry, out, &produced);
  Py_DECREF(out);
  if (!pushed) {
    PyErr_Clear();
    return Call::kPython;
  }
  torch::jit::drop(*stack, n);
  for (auto& value : produced) {
    stack->push_back(std::move(value));
  }
  return Call::kDone;
}

struct TableOpKernel final : public c10::OperatorKernel {
  explicit TableOpKernel(OpEntry* e) : entry(e) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    Pending outer;  // an enclosing call still to be learned (the Python kernel's own ops)
    {
      PyGILState_STATE gil = PyGILState_Ensure();
      outer = std::move(pending);
      pending = Pending();
      Call call = run_known_call(*entry, stack);
      if (call != Call::kPython) {
        pending = std::move(outer);
      }
      if (call == Call::kError) {
        python_error error;  // carries the Python exception back to the caller
        error.persist();
        PyGILState_Release(gil);
        throw error;
      }
      PyGILState_Release(gil);
      if (call == Call::kDone) {
        return;
      }
    }
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
    } catch (...) {
      restore(outer);
      throw;
    }
    restore(outer);
  }

  static void restore(Pending& outer) {
    PyGILState_STATE gil = PyGILState_Ensure();
    pending = std::move(outer);
    PyGILState_Release(gil);
  }

  OpEntry* entry;
};

PyObject* register_entry(const std::string& name, const std::string& overload, std::unique_ptr<OpEntry> entry);

// The dispatcher's schema of op `name`.`overload` (Python strings, kept in `name_out` and
// `overload_out`); throws when PyTorch has no such op.
const c10::FunctionSchema& schema_of(PyObject* name, PyObject* overload, std::string* name_out, std::string* overload_out) {
  *name_out = PyUnicode_AsUTF8(name);
  *overload_out = PyUnicode_AsUTF8(overload);
  return c10::Dispatcher::singleton().findSchemaOrThrow(name_out->c_str(), overload_out->c_str()).schema();
}

// install_op_kernel(name, overload) -> id: the C++ kernel of that op on PrivateUse1 (its
// Python kernel goes on PrivateUse2).
PyObject* py_install_op_kernel(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !PyUnicode_Check(argv[0]) || !PyUnicode_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "install_op_kernel(name, overload)");
    return nullptr;
  }
  std::string name, overload;
  try {
    const auto& schema = schema_of(argv[0], argv[1], &name, &overload);
    auto entry = std::make_unique<OpEntry>(schema);
    bool all_tensors = !schema.returns().empty();
    for (const auto& result : schema.returns()) {
      all_tensors = all_tensors && result.type()->kind() == c10::TypeKind::TensorType && !result.alias_info();
    }
    entry->returns = all_tensors ? schema.returns().size() : 0;
    entry->list_result = schema.returns().size() == 1 && !schema.returns()[0].alias_info() &&
        *schema.returns()[0].type() == *c10::ListType::ofTensors();
    for (const auto& argument : schema.arguments()) {
      if (argument.alias_info() && argument.alias_info()->isWrite()) {
        entry->returns = 0;  // a mutating op: the Python kernel writes (never the case for functional ops)
        entry->list_result = false;
      }
    }
    return register_entry(name, overload, std::move(entry));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

OpEntry* entry_of(PyObject* id);

// install_inplace_kernel(name, overload, functional_id, finish) -> id: the C++ kernel of an
// in-place op (`add_.Tensor`, `_foreach_mul_.Scalar`) whose functional op has the C++ kernel
// `functional_id`; `finish(self, result)` is the Python kernel's tail (its Python kernel goes
// on PrivateUse2).
PyObject* py_install_inplace_kernel(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 4 || !PyUnicode_Check(argv[0]) || !PyUnicode_Check(argv[1]) || !PyCallable_Check(argv[3])) {
    PyErr_SetString(PyExc_TypeError, "install_inplace_kernel(name, overload, functional_id, finish)");
    return nullptr;
  }
  OpEntry* functional = entry_of(argv[2]);
  if (functional == nullptr) {
    return nullptr;
  }
  std::string name, overload;
  try {
    const auto& schema = schema_of(argv[0], argv[1], &name, &overload);
    const auto& arguments = schema.arguments();
    bool self_written = !arguments.empty() && arguments[0].alias_info() && arguments[0].alias_info()->isWrite();
    for (size_t i = 1; i < arguments.size(); ++i) {
      self_written = self_written && !(arguments[i].alias_info() && arguments[i].alias_info()->isWrite());
    }
    bool self_tensor = self_written && arguments[0].type()->kind() == c10::TypeKind::TensorType;
    bool returns_self = schema.returns().size() == 1 && schema.returns()[0].alias_info() &&
        schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
    if (!self_written || (self_tensor ? !returns_self : !schema.returns().empty())) {
      throw std::runtime_error(name + "." + overload + " is not an in-place op of its first argument");
    }
    auto entry = std::make_unique<OpEntry>(schema);
    entry->returns = self_tensor ? 1 : 0;
    entry->functional = functional;
    entry->finish = Py_NewRef(argv[3]);
    OpEntry* raw = entry.get();
    PyObject* id = register_entry(name, overload, std::move(entry));
    if (id != nullptr) {
      functional->inplace_entries.push_back(raw);
    }
    return id;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// Registers `entry`'s kernel on PrivateUse1; returns its id.
PyObject* register_entry(const std::string& name, const std::string& overload, std::unique_ptr<OpEntry> entry) {
  try {
    entry->id = static_cast<long>(op_entries.size()) + 1;
    auto separator = name.find("::");
    std::string space = name.substr(0, separator);
    std::string op_name = name.substr(separator + 2) + (overload.empty() ? "" : "." + overload);
    auto& library = op_libraries[space];
    if (!library) {
      library = std::make_unique<torch::Library>(
          torch::Library::IMPL, space, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    }
    OpEntry* raw = entry.get();
    op_entries.push_back(std::move(entry));
    library->impl(
        op_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<TableOpKernel>(raw)));
    return PyLong_FromLong(raw->id);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

OpEntry* entry_of(PyObject* id) {
  long index = PyLong_AsLong(id);
  if (index < 1 || index > static_cast<long>(op_entries.size())) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "unknown native op id");
    }
    return nullptr;
  }
  return op_entries[index - 1].get();
}

// learn(id, value, dynamic_floats): the Python kernel of op `id` ran the pending call
// through its hot path with `value` (strict: the jitted lowering, or for an in-place op
// (jitted lowering, (donating lowering, ...) or None); fused: (OpKey, bound)).
PyObject* py_learn(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3) {
    PyErr_SetString(PyExc_TypeError, "learn(id, value, dynamic_floats)");
    return nullptr;
  }
  OpEntry* entry = entry_of(argv[0]);
  if (entry == nullptr) {
    return nullptr;
  }
  bool dynamic_floats = argv[2] == Py_True;
  OpEntry* learner = pending.entry;  // the op's own kernel, or one of its in-place ops'
  if (learner != nullptr && (learner == entry || learner->functional == entry) &&
      pending.dynamic_floats == dynamic_floats && entry->dynamic_floats == dynamic_floats) {
    auto& table = pending.fused ? learner->fused : learner->strict;
    PyObject* value = argv[1];
    bool pair = PyTuple_Check(value) && PyTuple_GET_SIZE(value) == 2;
    if (!pending.fused && pair) {  // an in-place call: its plain and donating lowerings
      PyObject* donating = PyTuple_GET_ITEM(value, 1);
      value = PyTuple_GET_ITEM(value, 0);
      if (learner->functional == entry && PyTuple_Check(donating) && PyTuple_GET_SIZE(donating) > 0) {
        auto& slot_ref = learner->donating[pending.key];
        Py_XSETREF(slot_ref, Py_NewRef(PyTuple_GET_ITEM(donating, 0)));
      } else {
        forget_donating(*learner, pending.key);
      }
    }
    if (!pending.fused || pair) {
      auto& slot_ref = table[pending.key];
      Py_INCREF(value);
      Py_XSETREF(slot_ref, value);
    }
  }
  pending.entry = nullptr;
  Py_RETURN_NONE;
}

// set_dynamic_floats(id, flag): the runner's floats became static (or dynamic): forget.
PyObject* py_set_dynamic_floats(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2) {
    PyErr_SetString(PyExc_TypeError, "set_dynamic_floats(id, flag)");
    return nullptr;
  }
  OpEntry* entry = entry_of(argv[0]);
  if (entry == nullptr) {
    return nullptr;
  }
  entry->dynamic_floats = argv[1] == Py_True;
  entry->forget();
  Py_RETURN_NONE;
}

PyObject* py_forget_calls(PyObject*, PyObject*) {
  for (auto& entry : op_entries) {
    entry->forget();
  }
  Py_RETURN_NONE;
}

PyObject* py_call_counts(PyObject*, PyObject*) {
  return Py_BuildValue("(LL)", native_requests, native_hits);
}

PyObject* py_reset_call_counts(PyObject*, PyObject*) {
  native_requests = native_hits = 0;
  Py_RETURN_NONE;
}

// configure_kernels(config: dict): what the C++ kernels need from the Python side.
PyObject* py_configure_kernels(PyObject*, PyObject* config) {
  if (!PyDict_Check(config)) {
    PyErr_SetString(PyExc_TypeError, "configure_kernels(config: dict)");
    return nullptr;
  }
  struct {
    const char* name;
    PyObject** target;
  } items[] = {
      {"modes_dict", &modes_dict},
      {"tensor_dict", &tensor_dict},
      {"fused_module", &fused_module},
      {"runner_module", &runner_module},
      {"run_jitted", &original_run_jitted},
      {"compiles_class", &compiles_class},
      {"note_compile", &note_compile_fn},
      {"wrap_outputs", &wrap_outputs_fn},
      {"cpu_to_jax", &cpu_to_jax_fn},
      {"torch_dtype", &torch_dtype_fn},
      {"payload_type", &payload_type},
      {"array_type", &array_type},
      {"lazy_type", &lazy_type},
  };
  for (auto& item : items) {
    PyObject* value = PyDict_GetItemString(config, item.name);  // borrowed
    if (value == nullptr) {
      PyErr_Format(PyExc_KeyError, "configure_kernels: missing %s", item.name);
      return nullptr;
    }
    Py_INCREF(value);
    Py_XSETREF(*item.target, value);
  }
  PyObject* sample = PyDict_GetItemString(config, "sample_tensor");
  if (sample == nullptr || !THPVariable_Check(sample)) {
    PyErr_SetString(PyExc_TypeError, "configure_kernels: sample_tensor must be a tpu tensor");
    return nullptr;
  }
  device_allocator = THPVariable_Unpack(sample).storage().allocator();
  if (device_allocator == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure_kernels: the device's storages have no allocator");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------ module

PyObject* py_configure(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5) {
    PyErr_SetString(PyExc_TypeError, "configure(payloads, slots, slot_fn, tensor_fn, flatten_fn)");
    return nullptr;
  }
  PyObject** targets[] = {&payloads, &slots, &slot_fn, &tensor_fn, &flatten_fn};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(argv[i]);
    Py_XDECREF(*targets[i]);
    *targets[i] = argv[i];
  }
  if (!PyDict_Check(payloads) || !PyList_Check(slots)) {
    PyErr_SetString(PyExc_TypeError, "configure: payloads must be a dict and slots a list");
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_install_device_guard(PyObject*, PyObject*) {
  if (!guard_registrar) {
    guard_registrar = std::make_unique<c10::impl::DeviceGuardImplRegistrar>(kTpu, &guard_impl);
  }
  Py_RETURN_NONE;
}

PyObject* py_install_view_kernels(PyObject*, PyObject*) {
  try {
    if (!view_library) {
      view_library = std::make_unique<torch::Library>(
          torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
      view_library->impl("as_strided", TORCH_FN(tpu_as_strided));
      view_library->impl("view", TORCH_FN(tpu_view));
      view_library->impl("_reshape_alias", TORCH_FN(tpu_reshape_alias));
      view_library->impl("unfold", TORCH_FN(tpu_unfold));
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_storage_key(PyObject*, PyObject* value) {
  if (!THPVariable_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "storage_key expects a tensor");
    return nullptr;
  }
  return storage_key_of(THPVariable_Unpack(value));
}

PyMethodDef methods[] = {
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_configure)), METH_FASTCALL,
     "Hand the payload table and the Python slow paths to flatten_args."},
    {"flatten_args", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_flatten_args)),
     METH_FASTCALL | METH_KEYWORDS,
     "arguments.flatten_args in C++ (slow cases call back into Python)."},
    {"install_device_guard", py_install_device_guard, METH_NOARGS, "Register the C++ PrivateUse1 device guard."},
    {"install_copy_kernel", py_install_copy_kernel, METH_NOARGS,
     "Register the C++ PrivateUse1 kernel of copy_ (tpu -> tpu; the rest: its Python kernel on PrivateUse2)."},
    {"install_view_kernels", py_install_view_kernels, METH_NOARGS,
     "Register the C++ PrivateUse1 kernels of as_strided, view, _reshape_alias, unfold."},
    {"write", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_write)), METH_FASTCALL,
     "tensor.write with its hot path in C++."},
    {"configure_write", py_configure_write, METH_O, "Hand tensor.write's Python definition to write."},
    {"input_refs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_input_refs)), METH_FASTCALL,
     "fused._Graph.input_ref for every input of a recorded node."},
    {"fused_record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_fused_record)), METH_FASTCALL,
     "fused.record in C++: record(key, fn, inputs) -> placeholders."},
    {"configure_fused", py_configure_fused, METH_O, "Hand fused_record the fused module's globals."},
    {"live_outputs", py_live_outputs, METH_O, "fused._live_outputs in C++: positions of the live placeholders."},
    {"donated", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_donated)), METH_FASTCALL,
     "fused._donated in C++: the external inputs a fused program may donate."},
    {"replace_computed_payloads",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_replace_computed_payloads)), METH_FASTCALL,
     "tensor.replace_computed_payloads in C++."},
    {"whole_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_whole_arrays)), METH_FASTCALL,
     "compiled_graph._read_inputs: each tpu tensor's whole payload array, or general(arg)."},
    {"split_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_split_arrays)), METH_FASTCALL,
     "compile.program._split in C++: (arrays, weak types, statics)."},
    {"storage_key", py_storage_key, METH_O, "The payload table's key of a tensor (its StorageImpl address)."},
    {"install_op_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_install_op_kernel)),
     METH_FASTCALL, "Register the C++ PrivateUse1 kernel of a table op (its Python kernel: PrivateUse2); its id."},
    {"install_inplace_kernel",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_install_inplace_kernel)), METH_FASTCALL,
     "Register the C++ PrivateUse1 kernel of a table op's in-place variant (its Python kernel: PrivateUse2)."},
    {"configure_kernels", py_configure_kernels, METH_O, "Hand the op kernels what they need from Python."},
    {"learn", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_learn)), METH_FASTCALL,
     "The Python kernel of op `id` ran the pending call: remember its jitted (or recorded) lowering."},
    {"set_dynamic_floats", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_set_dynamic_floats)),
     METH_FASTCALL, "An op's floats became static (or dynamic): forget its known calls."},
    {"forget_calls", py_forget_calls, METH_NOARGS, "Forget every known call (the jit caches were dropped)."},
    {"call_counts", py_call_counts, METH_NOARGS, "(requests, hits) of strict calls made by the C++ kernels."},
    {"reset_call_counts", py_reset_call_counts, METH_NOARGS, "Zero call_counts()."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_tpu_native", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__tpu_native() {
  str_array = PyUnicode_InternFromString("array");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_shape = PyUnicode_InternFromString("shape");
  str_value = PyUnicode_InternFromString("value");
  str_ref = PyUnicode_InternFromString("ref");
  str_weak_type = PyUnicode_InternFromString("weak_type");
  str_mode = PyUnicode_InternFromString("_mode");
  str_strict = PyUnicode_InternFromString("strict");
  str_fused = PyUnicode_InternFromString("fused");
  str_sync_each = PyUnicode_InternFromString("SYNC_EACH_COMPUTATION");
  str_record = PyUnicode_InternFromString("record");
  str_run_jitted = PyUnicode_InternFromString("_run_jitted");
  str_started = PyUnicode_InternFromString("started");
  str_aval = PyUnicode_InternFromString("aval");
  str_numel = PyUnicode_InternFromString("numel");
  str_key = PyUnicode_InternFromString("key");
  PyObject* slot_names[kPayloadSlots] = {str_numel, str_dtype, str_array, str_key, str_ref};
  std::copy(slot_names, slot_names + kPayloadSlots, payload_slot_names);
  str_graph = PyUnicode_InternFromString("_graph");
  str_lock = PyUnicode_InternFromString("_lock");
  str_acquire = PyUnicode_InternFromString("acquire");
  str_release = PyUnicode_InternFromString("release");
  str_max_nodes = PyUnicode_InternFromString("_max_nodes");
  str_sync = PyUnicode_InternFromString("sync");
  str_node_limit = PyUnicode_InternFromString("node_limit");
  str_n = PyUnicode_InternFromString("n");
  str_floats = PyUnicode_InternFromString("floats");
  str_external = PyUnicode_InternFromString("external");
  str_external_index = PyUnicode_InternFromString("external_index");
  str_state = PyUnicode_InternFromString("state");
  str_children = PyUnicode_InternFromString("children");
  str_nodes = PyUnicode_InternFromString("nodes");
  str_placeholders = PyUnicode_InternFromString("placeholders");
  return PyModule_Create(&module_def);
}
