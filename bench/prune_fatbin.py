# Zeroes the payloads of fatbin entries for GPU architectures other than KEEP in ELF shared
# libraries (headers kept), so that the files compress to a fraction of their size. Used only
# to carry a third-party peer (fbgemm-gpu) to a GPU host whose GPUs are all of arch KEEP.
import struct, sys
KEEP = int(sys.argv[1])
MAGIC = struct.pack('<I', 0xBA55ED50)
for path in sys.argv[2:]:
    data = bytearray(open(path, 'rb').read())
    pos = data.find(MAGIC); kept = zeroed = 0
    while pos >= 0:
        ver, hs, fs = struct.unpack_from('<HHQ', data, pos + 4)
        e, end = pos + hs, pos + hs + fs
        while e < end:
            kind, ev, ehs, ps = struct.unpack_from('<HHIQ', data, e)
            arch = struct.unpack_from('<I', data, e + 28)[0]
            if kind not in (1, 2) or ehs < 32 or e + ehs + ps > end:
                raise SystemExit(f'{path}: unexpected fatbin entry at {e}')
            if arch != KEEP:
                data[e + ehs:e + ehs + ps] = bytes(ps); zeroed += ps
            else:
                kept += ps
            e += ehs + ps
        pos = data.find(MAGIC, end)
    open(path, 'wb').write(data)
    print(f'{path}: kept {kept/1e6:.1f} MB, zeroed {zeroed/1e6:.1f} MB')
