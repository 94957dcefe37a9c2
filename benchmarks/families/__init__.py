"""Tiny random-weight transformers models, one builder per family, with the inputs and
references their measurements need: encoder-decoders (`seq2seq`), image-to-text
(`image_to_text`), sentence embedders (`embedder`) and vision-language models (`vlm`).
Built from configs in code (nothing downloaded); shared by the generative benchmarks and
the tests, which import them from here."""
