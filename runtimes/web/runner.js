// Runs a job (GET /job.json: models, their inputs, run counts) with LiteRT.js and POSTs
// each model's outputs and timings to /result.
// Tensors travel as base64 of their little-endian bytes, with shape and dtype.
import {loadLiteRt, loadAndCompile, Tensor} from '@litertjs/core';

const ARRAYS = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array};

function status(text) {
  document.getElementById('status').textContent = text;
}

function decode({data, shape, dtype}) {
  const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
  const Array = ARRAYS[dtype];
  if (!Array) throw new Error(`input dtype ${dtype} is not supported by LiteRT.js (float32, int32, uint8)`);
  return new Tensor(new Array(bytes.buffer), shape);
}

async function encode(tensor) {
  const array = await tensor.data();  // copies from WebGPU memory when the model ran there
  const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return {data: btoa(text), shape: Array.from(tensor.type.layout.dimensions), dtype: tensor.type.dtype};
}

async function post(body) {
  await fetch('/result', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
}

// WebGPU runs are asynchronous: a run counts until its outputs are read back.
async function timedRun(model, inputs, job) {
  const start = performance.now();
  const outputs = await model.run(inputs);
  if (job.accelerator === 'webgpu') await Promise.all(outputs.map((t) => t.data()));
  return [outputs, performance.now() - start];
}

async function runOne(task, job) {
  const t0 = performance.now();
  const model = await loadAndCompile(task.model, {accelerator: job.accelerator});
  const init = performance.now() - t0;
  const inputs = task.inputs.map(decode);
  let [outputs, first] = await timedRun(model, inputs, job);
  const times = [];
  for (let i = 0; i < job.warmup + job.runs; i++) {
    outputs.forEach((t) => t.delete());
    let ms;
    [outputs, ms] = await timedRun(model, inputs, job);
    if (i >= job.warmup) times.push(ms);
  }
  const result = {outputs: await Promise.all(outputs.map(encode)), init_ms: init, first_ms: first, times_ms: times};
  outputs.forEach((t) => t.delete());
  inputs.forEach((t) => t.delete());
  model.delete();
  return result;
}

async function main() {
  const job = await (await fetch('/job.json')).json();
  const t0 = performance.now();
  await loadLiteRt('/node_modules/@litertjs/core/wasm/', {threads: false});
  const loadMs = performance.now() - t0;
  const results = [];
  for (const [i, task] of job.tasks.entries()) {
    status(`running model ${i + 1} of ${job.tasks.length} ...`);
    try {
      results.push(await runOne(task, job));
    } catch (e) {  // one broken model does not stop the others
      results.push({error: String(e && e.stack ? e.stack : e)});
    }
  }
  await post({results, load_ms: loadMs, user_agent: navigator.userAgent});
  status('done');
}

main().catch(async (e) => {
  status(`error: ${e}`);
  await post({error: String(e && e.stack ? e.stack : e)});
});
