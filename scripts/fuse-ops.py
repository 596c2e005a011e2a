#!/usr/bin/env python3
"""FUSE requests and device calls per operation of a mounted ldfs.

Mounts a fresh ldfs image, runs small operation loops against it and counts,
with strace on the ldfs daemon, the FUSE requests it reads from /dev/fuse (by
opcode) and its device calls (pread64, pwrite64, fdatasync). Cold phases
remount first, so the kernel's caches are empty.
Needs root and strace.   ./scripts/fuse-ops.py [LDFS_BINARY] [WORK_DIR]
"""
import os, sys, subprocess, time, re, collections, signal
LDFS = sys.argv[1] if len(sys.argv) > 1 else 'target/release/ldfs'
WORK = sys.argv[2] if len(sys.argv) > 2 else '/var/tmp/ldfs-fuse-ops'
IMG = WORK + '/ldfs.img'; MNT = WORK + '/mnt'; TRACE = WORK + '/strace.txt'
OPS={1:'LOOKUP',2:'FORGET',3:'GETATTR',4:'SETATTR',5:'READLINK',6:'SYMLINK',8:'MKNOD',9:'MKDIR',10:'UNLINK',11:'RMDIR',12:'RENAME',13:'LINK',14:'OPEN',15:'READ',16:'WRITE',17:'STATFS',18:'RELEASE',20:'FSYNC',21:'SETXATTR',22:'GETXATTR',23:'LISTXATTR',24:'REMOVEXATTR',25:'FLUSH',26:'INIT',27:'OPENDIR',28:'READDIR',29:'RELEASEDIR',30:'FSYNCDIR',34:'ACCESS',35:'CREATE',36:'INTERRUPT',38:'DESTROY',42:'BATCH_FORGET',43:'FALLOCATE',44:'READDIRPLUS',45:'RENAME2',46:'LSEEK',47:'COPY_FILE_RANGE'}
def sh(*a): subprocess.run(a, check=True)
def daemon_pid():
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try: cmd=open(f'/proc/{p}/cmdline','rb').read().split(b'\0')
        except: continue
        if b'--daemon-child' in cmd and IMG.encode() in cmd: return int(p)
def mount():
    sh(LDFS,'mount','-o','transport=dev',IMG,MNT)  # strace counts /dev/fuse reads
    for _ in range(100):
        if daemon_pid(): return daemon_pid()
        time.sleep(0.05)
def umount():
    sh('fusermount3','-u',MNT)
    for _ in range(200):
        if not daemon_pid(): return
        time.sleep(0.05)
def measure(label, n, fn):
    pid=daemon_pid()
    fuse_fds={fd for fd in os.listdir(f'/proc/{pid}/fd') if os.readlink(f'/proc/{pid}/fd/{fd}')=='/dev/fuse'}
    st=subprocess.Popen(['strace','-f','-p',str(pid),'-o',TRACE,'-e','trace=read,pread64,pwrite64,pwritev,fdatasync,fsync','-s','8','-xx'],stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    fn()
    time.sleep(0.5)
    st.send_signal(signal.SIGINT); st.wait()
    ops=collections.Counter(); dev=collections.Counter()
    for line in open(TRACE):
        m=re.search(r'(?:\bread\((\d+), |<\.\.\. read resumed>)"((?:\\x[0-9a-f]{2}){8})', line)
        if m and (m.group(1) is None or m.group(1) in fuse_fds) and ' = -1' not in line:
            b=bytes(int(x,16) for x in re.findall(r'\\x([0-9a-f]{2})',m.group(2)))
            ops[OPS.get(int.from_bytes(b[4:8],'little'),str(int.from_bytes(b[4:8],'little')))]+=1
        for k in ('pread64','pwrite64','pwritev','fdatasync','fsync'):
            if re.search(r'\b'+k+r'\(', line) and 'resumed' not in line: dev[k]+=1
    tot=sum(ops.values())
    print(f'\n## {label}: {n} ops; FUSE requests {tot} ({tot/n:.2f}/op); device: ' + ', '.join(f'{k} {v} ({v/n:.2f}/op)' for k,v in sorted(dev.items())))
    print('   ' + ', '.join(f'{k} {v/n:.2f}' for k,v in ops.most_common()))
os.makedirs(MNT, exist_ok=True)
if daemon_pid(): umount()
if os.path.exists(IMG): os.remove(IMG)
sh(LDFS,'mkfs','--preallocate','--size','1G',IMG)
print('FUSE requests and device calls per operation (ldfs, strace on the daemon)')
mount()
N=1000; D=MNT+'/d'
def create():
    os.mkdir(D)
    for i in range(N):
        fd = os.open(f'{D}/f{i}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b'a' * 1024); os.close(fd)
    fd=os.open(MNT,os.O_RDONLY); os.fsync(fd); os.close(fd)
measure('create 1 KB file (write, close), then one ldfs sync', N, create)
umount(); mount()
def read():
    for i in range(N):
        fd = os.open(f'{D}/f{i}', os.O_RDONLY); os.read(fd, 4096); os.close(fd)
measure('read 1 KB file, cold (fresh mount)', N, read)
umount(); mount()
def stat():
    for i in range(N): os.stat(f'{D}/f{i}')
measure('stat, cold (fresh mount)', N, stat)
def rename():
    for i in range(N): os.rename(f'{D}/f{i}', f'{D}/r{i}')
    fd=os.open(MNT,os.O_RDONLY); os.fsync(fd); os.close(fd)
measure('rename in one directory, then one ldfs sync', N, rename)
def delete():
    for i in range(N): os.unlink(f'{D}/r{i}')
    fd=os.open(MNT,os.O_RDONLY); os.fsync(fd); os.close(fd)
measure('unlink, then one ldfs sync', N, delete)
with open(MNT+'/big','wb') as f: f.write(b'\1'*(16<<20)); os.fsync(f.fileno())
M=300
def syncwrite():
    import random; r=random.Random(1)
    fd=os.open(MNT+'/big',os.O_WRONLY)
    for i in range(M):
        os.pwrite(fd,b'\2'*4096,r.randrange(4096)*4096); os.fdatasync(fd)
    os.close(fd)
measure('4 KiB pwrite + fdatasync (one thread)', M, syncwrite)
os.mkdir(MNT+'/sc')
def synccreate():
    for i in range(M):
        fd=os.open(f'{MNT}/sc/f{i}',os.O_WRONLY|os.O_CREAT,0o644); os.write(fd,b'c'*4096); os.fsync(fd); os.close(fd)
        d=os.open(MNT+'/sc',os.O_RDONLY); os.fsync(d); os.close(d)
measure('synccreate: create 4 KB, fsync file, fsync dir', M, synccreate)
def seqwrite():
    with open(MNT+'/seq','wb') as f:
        for i in range(64): f.write(b'\3'*(1<<20))
        os.fsync(f.fileno())
measure('sequential write 1 MiB chunks + fsync (per MiB)', 64, seqwrite)
umount()
os.remove(IMG)
os.remove(TRACE)
os.rmdir(MNT)
