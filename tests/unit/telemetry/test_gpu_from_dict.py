"""GpuInfo.from_dict reads what to_dict writes (what members send each second), by
position when the keys are exactly the fields and no process is named, else by keyword:
the same object either way, and the same refusals."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtgpu.model.gpu import GpuInfo, GpuProcess

processes = st.lists(st.builds(GpuProcess, pid=st.integers(1, 2**22), used_vram_bytes=st.integers(0, 2**40),
                               name=st.text(max_size=20)), max_size=3)
gpus = st.builds(GpuInfo, index=st.integers(0, 63), vendor=st.sampled_from(["nvidia", "amd", "intel"]),
                 model=st.text(max_size=30), vram_total_bytes=st.integers(0, 2**41),
                 vram_used_bytes=st.integers(0, 2**41), utilization_pct=st.floats(0, 100),
                 uuid=st.text(max_size=40), processes=processes)


@given(gpus)
def test_what_to_dict_writes_reads_back_the_same(g):
    back = GpuInfo.from_dict(g.to_dict())
    assert back == g and type(back.processes) is list
    assert all(isinstance(p, GpuProcess) for p in back.processes)


def test_fewer_keys_take_the_defaults_and_unknown_or_missing_required_ones_are_refused():
    d = GpuInfo(1, "nvidia", "H200", 10, 2, 3.0, "u").to_dict()
    assert GpuInfo.from_dict({k: v for k, v in d.items() if k not in ("uuid", "processes")}).uuid == ""
    with pytest.raises(TypeError, match="extra"):
        GpuInfo.from_dict({**d, "extra": 1})
    with pytest.raises(TypeError, match="model"):
        GpuInfo.from_dict({k: v for k, v in d.items() if k != "model"})
