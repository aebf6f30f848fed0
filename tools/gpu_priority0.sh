#!/usr/bin/env bash
# Priority 0 on a GPU machine (the device tool), in one call, results under $OUT (or ./gpu_priority0):
# training gradients of HF models against float64 eager (tools/gpu_check.py), codegen_triton's suite on
# the GPU, and the integration tests that run CUDA graphs (`-k "cuda or attention"`).
#     bash tools/gpu_priority0.sh          # from the repository root; about 6 minutes on an H200
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu_priority0}
mkdir -p "$out"
export PYTHONPATH=$(ls -d "$PWD"/packages/*/src | tr '\n' ':')$PWD/integration/src
timeout 300 python tools/gpu_check.py --sizes small --models t5 llama bert gpt2 --processes 1 > "$out/gpu_check.txt" 2>&1
grep "^|" "$out/gpu_check.txt"
KILN_TRITON_TEST_DEVICE=cuda timeout 300 python -m pytest -q -x -n 4 -p no:cacheprovider packages/codegen_triton/tests \
    > "$out/triton_cuda.txt" 2>&1
echo "codegen_triton on the GPU: exit $?"; grep -E "^[.sxFE]+ +\[|FAILED" "$out/triton_cuda.txt" | tail -6
(cd integration/tests && KILN_INTEGRATION_TEST_DEVICE=cuda timeout 300 python -m pytest -q -n 4 -p no:cacheprovider \
    test_integration_donated_inputs.py test_integration_input_writes.py test_integration_attention_masks.py \
    test_integration_extern_output_reuse.py test_integration_scan_layouts.py test_integration_graph_cache.py \
    test_integration_group_norm.py test_integration_pooled_matmuls.py test_integration_scatter.py \
    test_integration_padded_linears.py -k "cuda or attention or padded" > "$out/integration_cuda.txt" 2>&1
 echo "integration on the GPU: exit $?"; grep -E "^[.sxFE]+ +\[|FAILED" "$out/integration_cuda.txt" | tail -6)
