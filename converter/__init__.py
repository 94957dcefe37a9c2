"""PyTorch ExportedProgram -> graph IR -> passes -> LiteRT flatbuffer bytes.

Entry points: `converter.pipeline.convert_module` (module -> IR Model) and
`converter.writer.write_flatbuffer` (IR Model -> bytes).
"""
