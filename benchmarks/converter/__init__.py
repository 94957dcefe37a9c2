"""The converter's benchmarks: conversion time against `torch.export`, file size, LiteRT
latency and error on the model zoo; quantization schemes; target profiles; recurrent ops;
peak memory. `litert_measure` is their LiteRT harness (the tests use it too)."""
