"""Benchmarks for amp-compiler and the real-model zoo they share with the tests.

See ``benchmarks.zoo`` for the models (BERT, GPT-2, ResNet-50, ViT, T5, Whisper,
ConvNeXt) built from transformers configs with random weights.
"""
