"""The layer's peak memory in use: every allocation goes through a pool whose bytes in use are
read after each malloc, so the peak is the call's own (CuPy's pool size after a call also counts
freed chunks it keeps, and grows with fragmentation: session 24 read 12.56 against 11.69 GiB of
pool for two backward orders without telling which). Prints the inputs' and the forward context's
bytes, then the forward's and the backward's peaks above them.
Usage (device): PYTHONPATH=. python bench/layer_memory.py [T ...]   (default 8192)"""
import sys


def main(Ts):
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_moe_inputs, make_grad_output

    pool = cp.cuda.MemoryPool()
    peak = [0]

    def malloc(size):
        mem = pool.malloc(size)
        peak[0] = max(peak[0], pool.used_bytes())
        return mem

    cp.cuda.set_allocator(malloc)
    gib = 2.0 ** 30
    cfg = cupy_moe.MoEConfig.glm45_air()
    for T in Ts:
        a = make_moe_inputs(cfg, T, seed=0, xp=cp)
        dy = make_grad_output(cfg, T, seed=1, xp=cp)
        cp.cuda.Device().synchronize()
        base = peak[0] = pool.used_bytes()
        out, ctx = cupy_moe.moe_forward(**a, config=cfg)
        cp.cuda.Device().synchronize()
        fwd_peak, kept = peak[0], pool.used_bytes()
        peak[0] = kept
        grads = cupy_moe.moe_backward(dy, ctx)
        cp.cuda.Device().synchronize()
        print(f"T={T}: inputs + dy {base / gib:.2f} GiB; forward peak +{(fwd_peak - base) / gib:.2f}, keeps "
              f"+{(kept - base) / gib:.2f} (out + context); backward peak +{(peak[0] - kept) / gib:.2f} above "
              f"that, gradients {(pool.used_bytes() - kept) / gib:.2f}")
        del out, ctx, grads, a, dy
        pool.free_all_blocks()


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or [8192])
