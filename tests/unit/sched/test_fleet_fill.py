"""Fleet's whole-array fill (`_fill`, from the views) writes what `refresh(row)` writes from
each row's NodeState, and gives equal rows equal state ids: refreshing every row
afterwards changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.sched.fleet import Fleet

from builders import cluster, make_gpu, make_node

ARRAYS = ("gmodel", "gindex", "vram_total", "idle", "open", "left", "left_sum", "shared_free", "meas_free", "load",
          "cpus_free", "mem_usable", "schedulable", "state_id")

GPU = st.builds(
    lambda model, vram, used, util, frac, cvram, excl, shared, over: dict(
        model=model, vram=vram, used=used, util=util, committed_fraction=frac, committed_vram=cvram, exclusive=excl,
        shared_jobs=shared, oversubscribed_jobs=over),
    st.sampled_from(("rtx4090", "a100", "h200")), st.sampled_from((0, "24G", "141G")),
    st.sampled_from((0, "1G", "24G", "3.3G")), st.sampled_from((0.0, 37.5, 100.0, 1 / 3)),
    st.sampled_from((0.0, 0.25, 1.0)), st.sampled_from((0, "2G")), st.booleans(), st.integers(0, 2), st.integers(0, 2))

NODE = st.tuples(st.lists(GPU, max_size=4), st.sampled_from((8, 32)), st.sampled_from((0, 4, 0.5)),
                 st.sampled_from((None, "0", "64G")), st.booleans(), st.sampled_from((0, "16G", "200G")))


def build(nodes) -> Fleet:
    views = []
    for k, (gpus, cpus, committed, mem_available, schedulable, mem_committed) in enumerate(nodes):
        views.append(make_node(f"n{k}", [make_gpu(i, **g) for i, g in enumerate(gpus)], cpus=cpus,
                               cpus_committed=committed, mem_available=mem_available, schedulable=schedulable,
                               mem_committed=mem_committed,
                               reason="" if schedulable else "drained"))
    return Fleet(cluster(*views))


@settings(max_examples=150, deadline=None)
@given(st.lists(NODE, max_size=6))
def test_the_fill_is_what_refreshing_every_row_writes(nodes):
    fleet = build(nodes)
    filled = {name: getattr(fleet, name).copy() for name in ARRAYS}
    ids = dict(fleet._ids)
    for i in range(fleet.n):
        fleet.refresh(i, log=False)
    fleet.row_keys(np.arange(fleet.n))  # the ids of the refreshed rows, made when read
    for name in ARRAYS:
        assert np.array_equal(getattr(fleet, name), filled[name]), name
    assert fleet._ids == ids  # no row got a key the fill had not made
    # a node is uniform when its GPUs are all of one kind (none counts as one)
    assert list(fleet.uniform) == [len({(x.vendor, x.model) for x in v.gpus}) <= 1 for v in fleet.states._views]


def test_equal_nodes_share_a_state_id_and_a_differing_one_does_not():
    fleet = build([([dict(model="a100", used=0, util=0.0, committed_fraction=0.0, committed_vram=0, exclusive=False,
                          shared_jobs=0, oversubscribed_jobs=0)], 8, 0, None, True, 0)] * 3 +
                  [([dict(model="a100", used="1G", util=0.0, committed_fraction=0.0, committed_vram=0, exclusive=False,
                          shared_jobs=0, oversubscribed_jobs=0)], 8, 0, None, True, 0)])
    assert list(fleet.state_id) == [0, 0, 0, 1]


def test_no_nodes():
    fleet = Fleet(cluster())
    assert fleet.n == 0 and fleet.state_id.shape == (0,)
