from mtgpu.agent.telemetry.host import sample_host


def test_host_sample_is_sane():
    sample_host()  # primes the non-blocking CPU measurement
    host = sample_host()
    assert host.cpu_count >= 1
    assert 0.0 <= host.cpu_util_pct <= 100.0
    assert 0 < host.mem_available_bytes <= host.mem_total_bytes
