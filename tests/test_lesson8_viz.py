"""Lesson 8's trip animation: the fused backward (three passes, re-reads written out) makes more trips than
eager's chain, and the animation still plays both to their end."""

from __future__ import annotations

import pytest
import torch

from fusionlab import viz
from fusionlab.kernels.attention_backward import attention_backward_ledger

pytestmark = pytest.mark.lesson8


def test_a_fused_schedule_longer_than_the_chain_plays_to_its_end():
    led = attention_backward_ledger(1, 16, 16384, 16384, 128, torch.bfloat16, block_m2=128, block_n1=128)
    n_unfused, n_fused = len(led.trips(fused=False)), len(led.trips(fused=True))
    assert n_fused > n_unfused  # the case this test is about
    anim = viz.TripAnimation(led)
    assert anim.n_frames == n_fused + 1
    anim.frame = anim.n_frames - 1
    assert anim.bytes_moved(True) == led.fused_bytes and anim.bytes_moved(False) == led.unfused_bytes
    anim.frame = n_unfused + 1  # the unfused chain is done, the fused schedule is not
    page = anim._panel(False, anim.frame)
    assert f"done: {n_unfused} trips in" in page and "fused schedule is still moving bytes" in page
    assert f"all {n_unfused} unfused trips made" in anim.static_html()
