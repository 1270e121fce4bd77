"""Publishing a finished local run to the platform: ``rollbridge eval upload`` and
``eval run --upload`` (docs/upload.md).

``files`` reads the run directory safely, ``plan`` validates it and chooses the files,
``identity`` resolves the platform, token and workspace scope, ``transport`` is the seam to a
platform protocol, ``import038`` is osmosis-ai 0.3.8's import protocol and ``put`` its presigned
PUTs, ``progress`` shows bytes, rate and ETA, ``command`` is the CLI.
"""
