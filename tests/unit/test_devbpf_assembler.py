"""The cgroup device eBPF program of agent/runners/devbpf.py, as bytes: each instruction's
encoding checked against values worked out by hand from include/uapi/linux/bpf.h, and the
whole program run by a small interpreter of the five opcodes it uses, on contexts the
kernel would pass (tests/integration/test_device_bpf.py runs it in the kernel)."""

from __future__ import annotations

import struct

import pytest

from mtgpu.agent.runners import devbpf
from mtgpu.agent.runners.devbpf import BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR, assemble, insn

ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4  # BPF_DEVCG_ACC_*, in access_type's upper 16 bits


def test_each_instruction_is_code_then_dst_in_the_low_nibble_src_in_the_high_then_off_then_imm():
    assert insn(0x61, dst=2, src=1, off=4) == bytes([0x61, 0x12, 4, 0, 0, 0, 0, 0])  # r2 = *(u32 *)(r1 + 4)
    assert insn(0x55, dst=3, off=3, imm=195) == bytes([0x55, 0x03, 3, 0, 195, 0, 0, 0])  # if r3 != 195 goto +3
    assert insn(0xB7, dst=0, imm=1) == bytes([0xB7, 0, 0, 0, 1, 0, 0, 0])  # r0 = 1
    assert insn(0x57, dst=2, imm=0xFFFF) == bytes([0x57, 0x02, 0, 0, 0xFF, 0xFF, 0, 0])  # r2 &= 0xffff
    assert insn(0x95) == bytes([0x95, 0, 0, 0, 0, 0, 0, 0])  # exit
    assert insn(0x05, off=-2) == bytes([0x05, 0, 0xFE, 0xFF, 0, 0, 0, 0])  # off is a signed 16-bit


def test_one_rule_assembles_to_the_expected_eleven_instructions():
    words = [struct.unpack("<BBhi", c) for c in chunks(assemble([("c", 195, 1)]))]
    assert words == [
        (0x61, 0x12, 0, 0),          # r2 = ctx->access_type
        (0x57, 0x02, 0, 0xFFFF),     # r2 &= 0xffff (the device type)
        (0x61, 0x13, 4, 0),          # r3 = ctx->major
        (0x61, 0x14, 8, 0),          # r4 = ctx->minor
        (0x55, 0x02, 4, BPF_DEVCG_DEV_CHAR),  # type differs: on to the next rule (5 on)
        (0x55, 0x03, 3, 195),
        (0x55, 0x04, 2, 1),
        (0xB7, 0x00, 0, 0),          # r0 = 0: deny
        (0x95, 0x00, 0, 0),
        (0xB7, 0x00, 0, 1),          # r0 = 1: allow
        (0x95, 0x00, 0, 0),
    ]


def test_no_rule_allows_everything():
    code = assemble([])
    assert len(code) == 6 * 8
    assert run(code, BPF_DEVCG_DEV_CHAR, 195, 0) == 1


@pytest.mark.parametrize("access", [ACC_READ, ACC_WRITE, ACC_MKNOD, ACC_READ | ACC_WRITE])
def test_the_program_denies_exactly_the_listed_nodes_for_every_access(access):
    code = assemble([("c", 195, 1), ("b", 8, 16), ("c", 240, 1048575), ("c", 4095, 0)])
    for typ, major, minor in [(BPF_DEVCG_DEV_CHAR, 195, 1), (BPF_DEVCG_DEV_BLOCK, 8, 16),
                              (BPF_DEVCG_DEV_CHAR, 240, 1048575), (BPF_DEVCG_DEV_CHAR, 4095, 0)]:
        assert run(code, typ, major, minor, access) == 0, (typ, major, minor)
    for typ, major, minor in [(BPF_DEVCG_DEV_CHAR, 195, 0),   # the GPU next to it
                              (BPF_DEVCG_DEV_CHAR, 195, 255),  # nvidiactl
                              (BPF_DEVCG_DEV_BLOCK, 195, 1),   # same numbers, other type
                              (BPF_DEVCG_DEV_CHAR, 8, 16),
                              (BPF_DEVCG_DEV_CHAR, 1, 3)]:     # /dev/null
        assert run(code, typ, major, minor, access) == 1, (typ, major, minor)


def test_many_rules_keep_every_jump_inside_the_program():
    rules = [("c", 240, m) for m in range(devbpf.MAX_RULES)]
    code = assemble(rules)
    assert len(code) // 8 <= devbpf.MAX_INSNS
    assert run(code, BPF_DEVCG_DEV_CHAR, 240, devbpf.MAX_RULES - 1) == 0
    assert run(code, BPF_DEVCG_DEV_CHAR, 240, devbpf.MAX_RULES) == 1


@pytest.mark.parametrize("rule, words", [
    (("x", 195, 0), "'c' (character) or 'b' (block)"),
    (("c", 4096, 0), "major must be 0..4095"),
    (("c", 195, 1 << 20), "minor 0..1048575"),
    (("c", -1, 0), "major must be"),
])
def test_a_rule_the_kernel_could_never_match_is_refused_naming_it(rule, words):
    with pytest.raises(ValueError) as e:
        assemble([rule])
    assert words in str(e.value) and str(rule) in str(e.value)


def test_more_rules_than_one_program_holds_are_refused():
    with pytest.raises(ValueError, match=f"at most {devbpf.MAX_RULES}"):
        assemble([("c", 240, m) for m in range(devbpf.MAX_RULES + 1)])


def test_an_architecture_without_a_known_syscall_number_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(devbpf.platform, "machine", lambda: "riscv64")
    with pytest.raises(OSError, match="not on 'riscv64'") as e:
        devbpf.syscall_number()
    assert e.value.errno == devbpf.errno.ENOSYS
    assert "riscv64" in devbpf.probe("/nonexistent")
    monkeypatch.setattr(devbpf.platform, "machine", lambda: "x86_64")
    assert devbpf.syscall_number() == 321


# -- a minimal interpreter: the opcodes assemble() emits, with the verifier's basic rules
def chunks(code: bytes) -> list[bytes]:
    assert len(code) % 8 == 0
    return [code[i:i + 8] for i in range(0, len(code), 8)]


def run(code: bytes, dev_type: int, major: int, minor: int, access: int = ACC_READ) -> int:
    ctx = struct.pack("<III", (access << 16) | dev_type, major, minor)
    regs: dict[int, int] = {1: -1}  # r1: the context (loads read ctx)
    prog = [struct.unpack("<BBhi", c) for c in chunks(code)]
    pc = 0
    for _ in range(len(prog)):  # no loops: each instruction runs at most once
        assert 0 <= pc < len(prog), f"jump out of the program to {pc}"
        op, regs_byte, off, imm = prog[pc]
        dst, src = regs_byte & 0x0F, regs_byte >> 4
        if op == devbpf.LDX_W_MEM:
            assert src == 1 and off in (0, 4, 8), "only the context's three u32 fields may be read"
            regs[dst] = struct.unpack_from("<I", ctx, off)[0]
        elif op == devbpf.AND64_K:
            regs[dst] = regs[dst] & (imm & 0xFFFFFFFFFFFFFFFF)
        elif op == devbpf.MOV64_K:
            regs[dst] = imm & 0xFFFFFFFFFFFFFFFF
        elif op == devbpf.JNE_K:
            assert off > 0, "only forward jumps"
            if regs[dst] != imm & 0xFFFFFFFFFFFFFFFF:
                pc += off
        elif op == devbpf.EXIT:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x} at {pc}")
        pc += 1
    raise AssertionError("the program ran off its end without exit")
