"""ONNX importer, emitter and file handling."""
