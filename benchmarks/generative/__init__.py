"""Exported generative models in LiteRT: decoders (prefill and decode latency, greedy
agreement, quantized, mixture-of-experts, the prefill's bound) and the family tables of
docs/generative_families.md (encoder-decoders, image-to-text, embedders and VLMs)."""
