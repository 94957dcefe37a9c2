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
//
// The lowerings, the payload table and fused mode's graph stay in Python. Loaded by
// tpu_backend/native/__init__.py; TPU_NATIVE=0 keeps the pure-Python path.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <memory>

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

// The storage's array when tensor `t` reads as it with no work (the hot path of
// `tensor.read` and `tensor.read_deferred`): borrowed from `payload`... as a new reference,
// or nullptr with no error set when the slow path must decide.
PyObject* whole_storage_array(const at::Tensor& t, PyObject* payload) {
  if (t.storage_offset() != 0 || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
    return nullptr;
  }
  PyObject* dtype = PyObject_GetAttr(payload, str_dtype);
  if (dtype == nullptr) {
    return nullptr;
  }
  bool same_dtype = dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  Py_DECREF(dtype);
  if (!same_dtype) {
    return nullptr;
  }
  PyObject* array = PyObject_GetAttr(payload, str_array);
  if (array == nullptr) {
    return nullptr;
  }
  if (array == Py_None) {
    Py_DECREF(array);
    return nullptr;
  }
  PyObject* shape = PyObject_GetAttr(array, str_shape);
  if (shape == nullptr) {
    Py_DECREF(array);
    return nullptr;
  }
  int same = same_shape(shape, t.sizes());
  Py_DECREF(shape);
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

// tensor.write(t, value): the hot path (in-place ops, optimizer updates: a value just like
// the tensor's whole storage) here, every other case in Python.
PyObject* py_write(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || python_write == nullptr) {
    PyErr_SetString(PyExc_TypeError, "write(t, value), after configure_write()");
    return nullptr;
  }
  PyObject* value = argv[1];
  if (payloads != nullptr && THPVariable_Check(argv[0])) {
    const at::Tensor& t = THPVariable_Unpack(argv[0]);
    int decided = 0;  // 1: written here, -1: error
    if (t.storage_offset() == 0 && t.is_contiguous() && !t.is_conj() && !t.is_neg()) {
      PyObject* key = storage_key_of(t);
      PyObject* payload = key ? PyDict_GetItemWithError(payloads, key) : nullptr;  // borrowed
      Py_XDECREF(key);
      PyObject* base = payload ? PyObject_GetAttr(payload, str_array) : nullptr;
      if (base != nullptr && base != Py_None) {
        PyObject* payload_dtype = PyObject_GetAttr(payload, str_dtype);
        PyObject* base_dtype = PyObject_GetAttr(base, str_dtype);
        PyObject* value_dtype = PyObject_GetAttr(value, str_dtype);
        PyObject* base_shape = PyObject_GetAttr(base, str_shape);
        PyObject* value_shape = PyObject_GetAttr(value, str_shape);
        if (payload_dtype && base_dtype && value_dtype && base_shape && value_shape) {
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
            decided = PyObject_SetAttr(payload, str_array, value) == 0 ? 1 : -1;
          } else if (same < 0) {
            decided = -1;
          }
        } else {
          decided = -1;
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
    }
    if (decided == 1) {
      Py_RETURN_NONE;
    }
  }
  return PyObject_Vectorcall(python_write, argv, 2, nullptr);
}

PyObject* py_configure_write(PyObject*, PyObject* fn) {
  Py_INCREF(fn);
  Py_XSETREF(python_write, fn);
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
    PyObject* shape = PyObject_GetAttr(value, str_shape);
    PyObject* dtype = shape ? PyObject_GetAttr(value, str_dtype) : nullptr;
    PyObject* weak = nullptr;
    if (dtype != nullptr) {
      weak = PyObject_GetAttr(value, str_weak_type);  // getattr(value, "weak_type", False)
      if (weak == nullptr && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        weak = Py_NewRef(Py_False);
      }
    }
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
    {"install_view_kernels", py_install_view_kernels, METH_NOARGS,
     "Register the C++ PrivateUse1 kernels of as_strided, view, _reshape_alias, unfold."},
    {"write", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_write)), METH_FASTCALL,
     "tensor.write with its hot path in C++."},
    {"configure_write", py_configure_write, METH_O, "Hand tensor.write's Python definition to write."},
    {"input_refs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_input_refs)), METH_FASTCALL,
     "fused._Graph.input_ref for every input of a recorded node."},
    {"storage_key", py_storage_key, METH_O, "The payload table's key of a tensor (its StorageImpl address)."},
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
  return PyModule_Create(&module_def);
}
