from patchbay.device import memfit

SMI = "51234, 143771\n50012, 143771\n"


def test_pages_a_request_holds_and_whether_a_level_fits():
    assert memfit.pages_for(8100, 64) == 32  # 8,164 tokens in pages of 256
    assert memfit.pages_for(8128, 64) == 32 and memfit.pages_for(8129, 64) == 33
    assert memfit.fits(1024, 32, 8100, 64)  # W10's memory-tp1-32: 32 x 32 pages, exactly the pool
    assert not memfit.fits(1024, 33, 8100, 64)
    assert not memfit.fits(1024, 32, 8129, 64)


def test_nvidia_smis_lines_are_one_pair_a_gpu():
    assert memfit.parse_smi(SMI) == [(51234, 143771), (50012, 143771)]
    assert memfit.parse_smi("") == []


def test_the_sampler_collects_until_stopped():
    reads = iter([[(1, 10), (2, 10)], [(5, 10), (3, 10)]] + [[(4, 10), (4, 10)]] * 1000)
    with memfit.Sampler(read=lambda: next(reads), every=0.001) as sampler:
        while len(sampler.samples) < 3:
            pass
    assert [s[1] for s in sampler.samples[:3]] == [[1, 2], [5, 3], [4, 4]]


def rec(prompt, completion, first, error=None):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "t_first": first, "error": error}


def test_the_report_counts_what_was_served_and_each_gpus_peak():
    recs = [rec(8101, 64, 1.5), rec(8101, 64, 0.7), rec(None, None, None, "server error: out of pages")]
    samples = [(0.0, [60000, 59000]), (0.2, [90000, 88000]), (0.4, [70000, 91000])]
    got = memfit.report(recs, samples, memfit.parse_smi(SMI), tp=2, pages=1024, streams=3, wall_s=4.256)
    assert got["ok"] == 2 and got["errors"] == ["server error: out of pages"]
    assert got["pool_tokens"] == 262144 and got["prompt_tokens"] == [8101]
    assert got["in_flight_prompt_tokens"] == 16202 and got["completion_tokens"] == 128
    assert got["pages_needed"] == 2 * 32 and got["ttft_s"] == [0.7, 1.5] and got["wall_s"] == 4.26
    assert got["gpu_mib_used_ready"] == [51234, 50012] and got["gpu_mib_used_peak"] == [90000, 91000]
    assert got["gpu_mib_headroom"] == [53771, 52771] and got["samples"] == 3
