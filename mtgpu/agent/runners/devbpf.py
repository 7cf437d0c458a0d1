"""GPU device fencing on cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program per job.

cgroup v2 has no devices controller; the kernel asks the eBPF programs attached to the
job's cgroup (and, with BPF_F_ALLOW_MULTI, those of its ancestors) whether a process may
open, read/write or mknod a device node. The program is assembled here by hand, with no
library: for each denied (type, major, minor) it compares the context
`struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}` (the device type
is access_type & 0xFFFF) and returns 0 (deny, the process gets EPERM) on a match, 1
(allow) otherwise; a container's program is the other way round, an allow-list
(`assemble_allow`: its own GPUs' nodes and the standard ones, everything else denied).
It is loaded and attached with the bpf() syscall through ctypes.

The attachment holds the program: the loader's file descriptor is closed after attaching,
and removing the cgroup detaches it. The program is attached with BPF_F_ALLOW_MULTI, so
that a program a container or service manager attached above the job (systemd, runc and
crun attach theirs with BPF_F_ALLOW_MULTI) still runs too; after attaching, the job's
effective programs are compared with its parent's, and when one of the parent's would no
longer run (an ancestor attached with BPF_F_ALLOW_OVERRIDE) the program is detached and
the fencing refused, rather than lifting that manager's device restrictions.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Iterable

# bpf() syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h
SYSCALL_BPF = {"x86_64": 321, "aarch64": 280}

# commands (enum bpf_cmd)
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16

BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # attach type
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_QUERY_EFFECTIVE = 1

BPF_DEVCG_DEV_BLOCK = 1
BPF_DEVCG_DEV_CHAR = 2
DEV_TYPES = {"b": BPF_DEVCG_DEV_BLOCK, "c": BPF_DEVCG_DEV_CHAR}

# opcodes (include/uapi/linux/bpf.h, bpf_common.h)
LDX_W_MEM = 0x61   # BPF_LDX | BPF_W | BPF_MEM:    dst = *(u32 *)(src + off)
AND64_K = 0x57     # BPF_ALU64 | BPF_AND | BPF_K:   dst &= imm
MOV64_K = 0xB7     # BPF_ALU64 | BPF_MOV | BPF_K:   dst = imm
JNE_K = 0x55       # BPF_JMP | BPF_JNE | BPF_K:     if dst != imm: pc += off
EXIT = 0x95        # BPF_JMP | BPF_EXIT:            return r0

R0, R1, R2, R3, R4 = range(5)
MAX_MAJOR = (1 << 12) - 1  # the kernel's dev_t: 12 bits of major, 20 of minor
MAX_MINOR = (1 << 20) - 1
INSNS_PER_RULE = 5
MAX_INSNS = 4096  # BPF_MAXINSNS: what every kernel accepts
MAX_RULES = (MAX_INSNS - 6) // INSNS_PER_RULE
LOG_SIZE = 1 << 16
PROG_NAME = b"mtgpu_devfence"


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One `struct bpf_insn` {u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm}, as a
    little-endian kernel reads it (dst_reg in the low nibble)."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def assemble(deny: Iterable[tuple[str, int, int]]) -> bytes:
    """The program denying these (type 'c' or 'b', major, minor) device nodes, every access
    (read, write, mknod); everything else is allowed.

        r2 = ctx->access_type; r2 &= 0xffff; r3 = ctx->major; r4 = ctx->minor
        per rule: if r2 != type goto next; if r3 != major goto next;
                  if r4 != minor goto next; r0 = 0; exit; next:
        r0 = 1; exit
    """
    return _assemble(deny, match=0, otherwise=1, what="to deny")


def assemble_allow(allow: Iterable[tuple[str, int, int | None]]) -> bytes:
    """The program allowing only these device nodes (minor None: every minor of the major),
    every access; every other device node is denied (a container's allow-list, as runc's
    own for a rootful container). The same code with the answers swapped, and no minor
    comparison for a rule without one."""
    return _assemble(allow, match=1, otherwise=0, what="to allow")


def _assemble(rules, *, match: int, otherwise: int, what: str) -> bytes:
    rules = list(rules)
    if len(rules) > MAX_RULES:
        raise ValueError(f"{len(rules)} device nodes {what}: one eBPF program holds at most {MAX_RULES}")
    code = [insn(LDX_W_MEM, R2, R1, 0), insn(AND64_K, R2, imm=0xFFFF),
            insn(LDX_W_MEM, R3, R1, 4), insn(LDX_W_MEM, R4, R1, 8)]
    for rule in rules:
        typ, major, minor = rule
        if typ not in DEV_TYPES:
            raise ValueError(f"device {rule}: the type must be 'c' (character) or 'b' (block), not {typ!r}")
        if not (isinstance(major, int) and 0 <= major <= MAX_MAJOR and
                ((minor is None and match == 1) or (isinstance(minor, int) and 0 <= minor <= MAX_MINOR))):
            raise ValueError(f"device {rule}: major must be 0..{MAX_MAJOR} and minor 0..{MAX_MINOR} "
                             "(the kernel's device numbers)")
        if minor is None:  # 4 instructions: to the next rule, 3 on
            code += [insn(JNE_K, R2, off=3, imm=DEV_TYPES[typ]),
                     insn(JNE_K, R3, off=2, imm=major)]
        else:  # 5 instructions: to the next rule, 4 on
            code += [insn(JNE_K, R2, off=4, imm=DEV_TYPES[typ]),
                     insn(JNE_K, R3, off=3, imm=major),
                     insn(JNE_K, R4, off=2, imm=minor)]
        code += [insn(MOV64_K, R0, imm=match), insn(EXIT)]
    code += [insn(MOV64_K, R0, imm=otherwise), insn(EXIT)]
    return b"".join(code)


# -- the bpf() syscall ----------------------------------------------------------------
class _ProgLoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32), ("log_buf", ctypes.c_uint64),
                ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]


class _AttachAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("replace_bpf_fd", ctypes.c_uint32)]


class _QueryAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


_libc = None


class StillAttached(OSError):
    """Attaching went wrong and the program could not be detached again: the cgroup must
    be removed (that detaches it)."""


def syscall_number() -> int:
    """bpf()'s number on this machine; OSError(ENOSYS) on an architecture not in the table."""
    machine = platform.machine()
    nr = SYSCALL_BPF.get(machine)
    if nr is None:
        raise OSError(errno.ENOSYS, f"device eBPF programs are supported on {', '.join(SYSCALL_BPF)} only, "
                                    f"not on {machine!r} (its bpf() syscall number is not known here)")
    return nr


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    global _libc
    nr = syscall_number()
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {errno.errorcode.get(err, err)} ({os.strerror(err)}){_hint(err, cmd)}")
    return int(ret)


def _hint(err: int, cmd: int) -> str:
    if err == errno.EPERM:
        if cmd == BPF_PROG_ATTACH:
            return ("; an ancestor cgroup has a device program attached without BPF_F_ALLOW_MULTI or "
                    "BPF_F_ALLOW_OVERRIDE, which forbids programs below it, or this process lacks "
                    "CAP_SYS_ADMIN (or CAP_BPF and CAP_NET_ADMIN)")
        return "; it needs CAP_SYS_ADMIN (or CAP_BPF and CAP_NET_ADMIN): run the server as root with them"
    if err == errno.EINVAL:
        return ("; this kernel lacks cgroup device programs (CONFIG_CGROUP_BPF, Linux 4.15 or later) "
                "or refuses these arguments")
    if err == errno.ENOSYS:
        return "; this kernel has no bpf() syscall (CONFIG_BPF_SYSCALL)"
    if err == errno.EBADF and cmd in (BPF_PROG_ATTACH, BPF_PROG_QUERY):
        return "; the target is not a cgroup v2 directory"
    return ""


def load(deny: Iterable[tuple[str, int, int]], allow: Iterable[tuple[str, int, int | None]] | None = None) -> int:
    """Load the program denying these device nodes, or (`allow` given) allowing only those;
    returns its fd (close-on-exec)."""
    return load_code(assemble(deny) if allow is None else assemble_allow(allow))


def load_code(code: bytes) -> int:
    """Load these instructions as a cgroup device program; returns its fd (close-on-exec).
    A verifier refusal is raised with the verifier's text."""
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = _ProgLoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code) // 8,
                         insns=ctypes.addressof(insns), license=ctypes.addressof(license_),
                         log_level=1, log_size=LOG_SIZE, log_buf=ctypes.addressof(log),
                         prog_name=PROG_NAME, expected_attach_type=BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the cgroup device eBPF program (BPF_PROG_LOAD)")
    except OSError as e:
        lines = log.value.decode(errors="replace").strip().splitlines()
        if lines and e.errno in (errno.EACCES, errno.EINVAL, errno.ENOSPC):
            raise OSError(e.errno, f"{e.strerror}; the verifier said: {' | '.join(lines[-20:])}") from None
        raise


def _query_effective(dir_fd: int, where: str) -> list[int]:
    """Ids of the device programs that run for the cgroup open at dir_fd."""
    for _ in range(3):
        attr = _QueryAttr(target_fd=dir_fd, attach_type=BPF_CGROUP_DEVICE, query_flags=BPF_F_QUERY_EFFECTIVE)
        _bpf(BPF_PROG_QUERY, attr, f"querying the device programs of {where} (BPF_PROG_QUERY)")
        count = attr.prog_cnt
        if count == 0:
            return []
        ids = (ctypes.c_uint32 * count)()
        attr = _QueryAttr(target_fd=dir_fd, attach_type=BPF_CGROUP_DEVICE, query_flags=BPF_F_QUERY_EFFECTIVE,
                          prog_ids=ctypes.addressof(ids), prog_cnt=count)
        try:
            _bpf(BPF_PROG_QUERY, attr, f"querying the device programs of {where} (BPF_PROG_QUERY)")
        except OSError as e:
            if e.errno == errno.ENOSPC:  # one was attached meanwhile
                continue
            raise
        return list(ids[:attr.prog_cnt])
    raise OSError(errno.EAGAIN, f"the device programs of {where} kept changing while being listed")


def _open_dir(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, f"opening the cgroup directory {path} for a device program failed: "
                               f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror})") from e


def attach(prog_fd: int, cgroup_dir: str) -> None:
    """Attach the loaded program to the cgroup v2 directory `cgroup_dir` with
    BPF_F_ALLOW_MULTI; detaches it again and raises when that would stop a program of
    an ancestor from running for this cgroup."""
    parent = os.path.dirname(os.path.normpath(cgroup_dir))
    dir_fd = _open_dir(cgroup_dir)
    try:
        parent_fd = _open_dir(parent)
        try:
            above = _query_effective(parent_fd, parent)
        finally:
            os.close(parent_fd)
        attr = _AttachAttr(target_fd=dir_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE,
                           attach_flags=BPF_F_ALLOW_MULTI)
        _bpf(BPF_PROG_ATTACH, attr, f"attaching the device program to {cgroup_dir} (BPF_PROG_ATTACH)")
        try:
            now = _query_effective(dir_fd, cgroup_dir)
            lost = set(above) - set(now)
            if lost:
                raise OSError(errno.EPERM, (
                    f"attaching the device program to {cgroup_dir} would stop the device program(s) "
                    f"{sorted(lost)} attached above it from running for it (an ancestor attached with "
                    "BPF_F_ALLOW_OVERRIDE instead of BPF_F_ALLOW_MULTI): detached again, so as not to lift "
                    "that manager's device restrictions; have it attach with BPF_F_ALLOW_MULTI"))
        except OSError as e:
            detach = _AttachAttr(target_fd=dir_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE)  # no flags
            try:
                _bpf(BPF_PROG_DETACH, detach, f"detaching the device program from {cgroup_dir} (BPF_PROG_DETACH)")
            except OSError as d:
                raise StillAttached(d.errno, f"{e.strerror}; and {d.strerror}: remove the cgroup {cgroup_dir}") from e
            raise
    finally:
        os.close(dir_fd)


class _GetFdByIdAttr(ctypes.Structure):
    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


def detach_all(cgroup_dir: str) -> int:
    """Detach every device program attached to the cgroup v2 directory `cgroup_dir` itself
    (not those above it, which keep running for it); returns how many were detached."""
    dir_fd = _open_dir(cgroup_dir)
    try:
        attr = _QueryAttr(target_fd=dir_fd, attach_type=BPF_CGROUP_DEVICE)  # attached here, not the effective ones
        _bpf(BPF_PROG_QUERY, attr, f"querying the device programs of {cgroup_dir} (BPF_PROG_QUERY)")
        count = attr.prog_cnt
        if count == 0:
            return 0
        ids = (ctypes.c_uint32 * count)()
        attr = _QueryAttr(target_fd=dir_fd, attach_type=BPF_CGROUP_DEVICE, prog_ids=ctypes.addressof(ids),
                          prog_cnt=count)
        _bpf(BPF_PROG_QUERY, attr, f"querying the device programs of {cgroup_dir} (BPF_PROG_QUERY)")
        for prog_id in ids[:attr.prog_cnt]:
            prog_fd = _bpf(BPF_PROG_GET_FD_BY_ID, _GetFdByIdAttr(prog_id=prog_id),
                           f"opening device program {prog_id} (BPF_PROG_GET_FD_BY_ID)")
            try:
                _bpf(BPF_PROG_DETACH, _AttachAttr(target_fd=dir_fd, attach_bpf_fd=prog_fd,
                                                  attach_type=BPF_CGROUP_DEVICE),
                     f"detaching device program {prog_id} from {cgroup_dir} (BPF_PROG_DETACH)")
            finally:
                os.close(prog_fd)
        return attr.prog_cnt
    finally:
        os.close(dir_fd)


def fence(cgroup_dir: str, deny: Iterable[tuple[str, int, int]] = (),
          allow: Iterable[tuple[str, int, int | None]] | None = None) -> None:
    """Deny the processes of the cgroup v2 directory `cgroup_dir` (and of its descendants)
    these device nodes, or (`allow` given: a container's) every device node but those. The
    program stays attached until the cgroup is removed."""
    prog_fd = load(deny, allow)
    try:
        attach(prog_fd, cgroup_dir)
    finally:
        os.close(prog_fd)


def reason(e: BaseException) -> str:
    """An error of this module (or of the cgroup files it opens) as one sentence, without
    Python's "[Errno N]" prefix."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    return str(e)


def probe(parent_dir: str) -> str | None:
    """Whether device programs can be loaded and attached below the cgroup v2 directory
    `parent_dir`: None when they can, else why not. Tries it on a child cgroup made and
    removed for the purpose."""
    try:
        syscall_number()
    except OSError as e:
        return e.strerror
    d = os.path.join(parent_dir, f"devbpf-probe-{os.getpid()}")
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot make a cgroup to try a device eBPF program in ({d}: {e.strerror})"
    try:
        fence(d, [("c", MAX_MAJOR, MAX_MINOR)])  # a one-rule program; the group holds no process
        return None
    except (OSError, ValueError) as e:
        return reason(e)
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass
