#!/usr/bin/env bash
# Train the shipped synthetic:trained on a GPU machine with torch but no network, no tokenizer and
# no patchbay (patchbay.runtime.trained says the whole way). Runs from a bundle folder made here by
# `trained.write_bundle(DIR)` (corpus.safetensors, train_gpu.py, this file as train_gpu.sh), plus
# DIR/wheels/: the pinned engine's wheel, pristine (`build.build(None).wheel`, 13 MB), and
# regex as a cp312 wheel (0.8 MB), since the GPU image's transformers is older than the pin and its
# regex may be older than the pin asks for; the image's own huggingface_hub, safetensors,
# tokenizers, numpy and the rest serve.
#   DIR/train_gpu.sh OUT [trainer arguments...]    e.g. OUT=$OUT, --seconds 150
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: train_gpu.sh OUT [trainer arguments...]}"; shift
site=/tmp/pb-trained-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$here"/wheels/*.whl
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -u "$here/train_gpu.py" --corpus "$here/corpus.safetensors" --out "$out" "$@"
