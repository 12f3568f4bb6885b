#!/usr/bin/env python3
"""How the page cache holds a file: reads FILE through read(2) (so it is
cached), maps it, and counts its pages by folio through /proc/self/pagemap
and /proc/kpageflags (root only). Run it on a file in a leasefs mount and on
a copy on the native disk to compare.

    benches/probes/folios.py FILE
"""
import ctypes, os, struct, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_READ, MAP_SHARED = 1, 1

path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
while os.read(fd, 1 << 20):
    pass
base = libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
if base in (None, ctypes.c_void_p(-1).value):
    sys.exit(f"mmap: errno {ctypes.get_errno()}")
n = size // 4096
for i in range(n):
    ctypes.c_char.from_address(base + i * 4096).value  # fault the page in
heads = tails = single = absent = 0
with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
    for i in range(n):
        pm.seek((base // 4096 + i) * 8)
        e = struct.unpack("Q", pm.read(8))[0]
        if not (e >> 63) & 1:
            absent += 1
            continue
        kf.seek((e & ((1 << 55) - 1)) * 8)
        f = struct.unpack("Q", kf.read(8))[0]
        if f >> 15 & 1:
            heads += 1   # KPF_COMPOUND_HEAD: first page of a large folio
        elif f >> 16 & 1:
            tails += 1   # KPF_COMPOUND_TAIL
        else:
            single += 1
print(f"{path}: {n} pages: {single} in single-page folios, {heads} large folios holding {heads + tails} pages, {absent} not present")
