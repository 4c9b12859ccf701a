"""Does CUDA IPC work between two processes on this machine's GPU?  (A CUDA tensor sent through a
torch.multiprocessing queue travels as a cudaIpcMemHandle; the child opens it and reads it.)
Prints one line: "cuda ipc: works ..." or "cuda ipc: FAILS ..."; exit 0 / 1, 77 without a GPU."""
import sys
import time


def child(q, r):
    import torch
    t = q.get()
    r.put(float(t.sum()))
    t.add_(1)  # written through the mapping: the parent must see it
    torch.cuda.synchronize()
    r.put("done")


def main():
    import torch
    import torch.multiprocessing as mp
    if not torch.cuda.is_available():
        print("cuda ipc: no GPU: skipped")
        return 77
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    t0 = time.perf_counter()
    q.put(t)
    try:
        got = r.get(timeout=60)
        done = r.get(timeout=60)
    except Exception as e:  # noqa: BLE001  (any failure is the answer)
        print(f"cuda ipc: FAILS ({type(e).__name__}: {e}; child exit {p.exitcode})")
        p.kill()
        return 1
    p.join(30)
    want = float(torch.arange(1 << 20, dtype=torch.float64).sum())
    ok = abs(got - want) <= 1e-6 * want and done == "done" and float(t[5]) == 6.0
    print(f"cuda ipc: {'works' if ok else 'FAILS'} (child read sum {got:.6g}, want {want:.6g}; "
          f"its write seen: {float(t[5]) == 6.0}; round trip {time.perf_counter() - t0:.2f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
