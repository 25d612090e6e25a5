"""Run by tests/test_kernel_asm.py with the patched engine first on PYTHONPATH: compiles the
series' main Triton kernels for an H100/H200 (sm_90) on this machine, with no GPU (Triton ships
ptxas), at the launch shapes the engine uses, and counts in each kernel's PTX what decides its
memory traffic: global stores and loads, and how many of them move 16 bytes at once, async copies
into shared memory (a pipelined loop) and warp-group MMAs. Prints one JSON line.

The arguments carry the hints Triton's launcher gives real tensors (16-byte aligned pointers and
strides divisible by 16), or the compiler assumes the worst and the counts mean nothing."""

import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from transformers._pb.ops import fused_moe, invariant_gemm, moe_one_path
from transformers._pb.ops.kernels import fused_moe as moe_kernels, invariant_gemm as gemm_kernels
from transformers._pb.ops.kernels import varlen_attention as attention_kernels

ALIGNED = ["tt.divisibility", 16]  # what the launcher tells the compiler of a 16-byte aligned argument


def pointers(signature: dict) -> list:
    return [name for name, kind in signature.items() if kind.startswith("*")]


def compile_for_sm90(fn, signature: dict, constexprs: dict, aligned: list, warps: int, stages: int,
                     out_tile: tuple[int, int]) -> dict:
    """The counts for one kernel at one launch; out_tile: the [rows, columns] a program stores."""
    names = list(signature)
    attrs = {(names.index(name),): [ALIGNED] for name in aligned}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptx = kernel.asm["ptx"]
    return {"stores": len(re.findall(r"\bst\.global", ptx)), "stores_16b": len(re.findall(r"\bst\.global\S*\.v(4\.b32|8)", ptx)),
            "async_copies": len(re.findall(r"\bcp\.async\.", ptx)), "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
            "shared_bytes": kernel.metadata.shared, "values_a_thread": out_tile[0] * out_tile[1] // (32 * warps),
            "atomics": re.findall(r"\batom\.[\w.]+", ptx), "conversions": len(re.findall(r"\bcvt\.", ptx))}


gate_up, down = moe_kernels.pb_moe_gate_up, moe_kernels.pb_moe_down
MOE_INTS = ["n_pairs", "hidden", "inter", "stride_we", "stride_wn"]
down_sig = {"h_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "rows_ptr": "*i32", "block_expert_ptr": "*i32",
            "weights_ptr": "*fp32", "n_pairs": "i32", "hidden": "i32", "inter": "i32", "stride_h": "i32",
            "stride_we": "i32", "stride_wn": "i32", "stride_y": "i32", "BM": "constexpr", "BN": "constexpr",
            "BK": "constexpr", "EVEN_K": "constexpr", "W_TMA": "constexpr"}
gate_up_sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "h_ptr": "*bf16", "rows_ptr": "*i32", "block_expert_ptr": "*i32",
               "n_pairs": "i32", "top_k": "i32", "hidden": "i32", "inter": "i32", "stride_x": "i32", "stride_we": "i32",
               "stride_wn": "i32", "stride_h": "i32", "BM": "constexpr", "BN": "constexpr",
               "BK": "constexpr", "EVEN_K": "constexpr", "W_TMA": "constexpr"}
report = {}
# 0220's decode launch (16-row blocks) and 0390's large-step launch (128-row blocks), each kernel at
# the tile the engine gives it
for label, bm, gu_tiles, down_tiles in (("decode", fused_moe.BLOCK_M, *fused_moe.DECODE_TILES),
                                        ("large", moe_one_path.BLOCK_M, moe_one_path.GATE_UP_TILES,
                                         moe_one_path.DOWN_TILES)):
    bn, bk, warps, stages = gu_tiles
    report[f"moe_gate_up_{label}"] = compile_for_sm90(
        gate_up, gate_up_sig, {"BM": bm, "BN": bn, "BK": bk, "EVEN_K": True, "W_TMA": False},
        pointers(gate_up_sig) + MOE_INTS + ["stride_x", "stride_h"], warps, stages, (bm, bn))
    bn, bk, warps, stages = down_tiles
    report[f"moe_down_{label}"] = compile_for_sm90(
        down, down_sig, {"BM": bm, "BN": bn, "BK": bk, "EVEN_K": True, "W_TMA": False},
        pointers(down_sig) + MOE_INTS + ["stride_h", "stride_y"], warps, stages, (bm, bn))
# 0380's GEMM, one chunk, a prompt's tile (its strides as F.linear lays out a weight: K contiguous)
gemm_sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32",
            "K": "i32", "CHUNK_K": "i32", "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "constexpr",
            "stride_bn": "i32", "stride_om": "i32", "stride_on": "constexpr", "HAS_BIAS": "constexpr",
            "CHUNKED": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
            "GROUP_M": "constexpr", "PRECISION": "constexpr"}
gemm_constants = {"stride_ak": 1, "stride_bk": 1, "stride_on": 1, "HAS_BIAS": False, "CHUNKED": False, "BLOCK_M": 128,
                  "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "PRECISION": "ieee"}
gemm_aligned = pointers(gemm_sig) + ["N", "K", "CHUNK_K", "stride_am", "stride_bn", "stride_om"]
report["invariant_gemm_prompt"] = compile_for_sm90(gemm_kernels.pb_gemm, gemm_sig, gemm_constants, gemm_aligned, 8, 3,
                                                   (128, 128))
# 0810's float8 kernels at a decode step's and a prompt's launch (Air's blocks: 128 deep)
fp8_gemm_sig = {"a_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "s_rows_ptr": "*i32", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "part_ptr": "*fp32", "counter_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
                "CHUNK_K": "i32", "k_offset": "i32", "stride_am": "i32", "stride_wn": "i32", "stride_om": "i32",
                "stride_on": "constexpr", "stride_sn": "i32", "stride_sk": "constexpr", "HAS_BIAS": "constexpr",
                "SPLIT": "constexpr", "LAST_SUM": "constexpr", "SCALE_K": "constexpr", "BLOCK_M": "constexpr",
                "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "PRECISION": "constexpr", "STEP_SCALE": "constexpr"}
fp8_moe_sig = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "h_ptr": "*bf16", "rows_ptr": "*i32", "block_expert_ptr": "*i32",
               "s_ptr": "*fp32", "s_rows_ptr": "*i32", "n_pairs": "i32", "top_k": "i32", "hidden": "i32",
               "inter": "i32", "k_offset": "i32", "stride_x": "i32", "stride_we": "i32", "stride_wn": "i32",
               "stride_h": "i32", "stride_se": "i32", "stride_sn": "i32", "stride_sk": "constexpr",
               "SCALE_K": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "PRECISION": "constexpr",
                "STEP_SCALE": "constexpr"}
fp8_down_sig = {"h_ptr": "*bf16", "w_ptr": "*fp8e4nv", "y_ptr": "*bf16", "rows_ptr": "*i32", "block_expert_ptr": "*i32",
                "weights_ptr": "*fp32", "s_ptr": "*fp32", "s_rows_ptr": "*i32", "n_pairs": "i32", "hidden": "i32",
                "inter": "i32", "k_offset": "i32", "stride_h": "i32", "stride_we": "i32", "stride_wn": "i32",
                "stride_y": "i32", "stride_se": "i32", "stride_sn": "i32", "stride_sk": "constexpr",
                "SCALE_K": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "PRECISION": "constexpr",
                "STEP_SCALE": "constexpr"}
# the decode launch as a chunked product runs it with 0950 (its parts added by each tile's last program)
# and with 0960 (each step's sum scaled, the weight widened by integer operations)
for label, rows in (("decode", 16), ("large", 128), ("last_sum", 16), ("step_scale", 16)):
    tile = invariant_gemm.fp8_tiles(1 if label != "large" else 8192)
    split = label == "last_sum"
    report[f"fp8_gemm_{label}"] = compile_for_sm90(
        gemm_kernels.pb_gemm_fp8, fp8_gemm_sig,
        {"stride_on": 1, "stride_sk": 1, "HAS_BIAS": split, "SPLIT": split, "LAST_SUM": split, "SCALE_K": 128,
         "BLOCK_M": tile.m, "BLOCK_N": tile.n, "BLOCK_K": 128, "PRECISION": "ieee",
         "STEP_SCALE": label == "step_scale"},
        pointers(fp8_gemm_sig) + ["N", "K", "CHUNK_K", "stride_am", "stride_wn", "stride_om"], tile.warps, tile.stages,
        (tile.n, tile.m))
    moe_tile = invariant_gemm.fp8_tiles(rows)  # fused_moe._fp8_products' launch for blocks of `rows` pairs
    width, warps, stages = moe_tile.n, moe_tile.warps, moe_tile.stages
    moe = {"SCALE_K": 128, "BM": rows, "BN": width, "BK": 128, "PRECISION": "ieee", "stride_sk": 1, "STEP_SCALE": False}
    report[f"fp8_moe_gate_up_{label}"] = compile_for_sm90(
        moe_kernels.pb_moe_gate_up_fp8, fp8_moe_sig, moe,
        pointers(fp8_moe_sig) + ["hidden", "inter", "stride_x", "stride_we", "stride_wn", "stride_h"], warps, stages,
        (width, rows))
    report[f"fp8_moe_down_{label}"] = compile_for_sm90(
        moe_kernels.pb_moe_down_fp8, fp8_down_sig, moe,
        pointers(fp8_down_sig) + ["hidden", "inter", "stride_h", "stride_we", "stride_wn", "stride_y"], warps, stages,
        (width, rows))
# 0370's prompt kernel at air12's heads (96 query heads on 8 KV heads, 128 wide), pointer loads (0400 off),
# the step's own keys (0750 off: idx_ptr unread)
attn_sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "k_desc": "*bf16",
            "v_desc": "*bf16", "idx_ptr": "*i32", "cu_q_ptr": "*i32",
            "cu_k_ptr": "*i32", "block_end_ptr": "*i32", "sequences": "i32", "scale": "fp32", "stride_qt": "i32",
            "stride_qh": "i32", "stride_kt": "i32", "stride_kh": "i32", "stride_vt": "i32", "stride_vh": "i32",
            "stride_ot": "i32", "stride_oh": "i32", "GROUPS": "constexpr", "HEAD_DIM": "constexpr",
            "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "SEQ_P2": "constexpr", "FAST": "constexpr",
            "INDEXED": "constexpr", "TURNS": "constexpr", "COUNT": "constexpr"}
# and with 0950 (the step's blocks counted in the kernel, 0940's turns)
for label, count in (("varlen_attention_prompt", False), ("varlen_attention_prompt_counted", True)):
    report[label] = compile_for_sm90(
        attention_kernels.pb_varlen_attention, attn_sig,
        {"GROUPS": 12, "HEAD_DIM": 128, "BLOCK_M": 128, "BLOCK_N": 128, "SEQ_P2": 16, "FAST": False, "INDEXED": False,
         "TURNS": count, "COUNT": count},
        pointers(attn_sig) + [name for name in attn_sig if name.startswith("stride_")], 8, 3, (128, 128))
kv_sig = {"k_ptr": "*bf16", "v_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "idx_ptr": "*i64",
          "stride_kt": "i32", "stride_kh": "i32", "stride_vt": "i32", "stride_vh": "i32", "stride_ct": "i32",
          "stride_ch": "i32", "KV_HEADS": "constexpr", "HEAD_DIM": "constexpr", "BLOCK_H": "constexpr"}
report["kv_write"] = compile_for_sm90(
    attention_kernels.pb_kv_write, kv_sig, {"KV_HEADS": 8, "HEAD_DIM": 128, "BLOCK_H": 8},
    pointers(kv_sig) + [name for name in kv_sig if name.startswith("stride_")], 4, 1, (8, 128))
print(json.dumps(report))
