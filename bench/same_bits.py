"""A digest of every output of moe_backward and sol080_backward on fixed inputs, to tell whether two
trees compute the same bits (a change meant to keep them, e.g. a kernel's instructions reordered):
run it in each tree on the same machine and compare the lines.
Usage (device): PYTHONPATH=. python bench/same_bits.py [--layer-T 1000,8192] [--sol080-T 192,1321]"""
import argparse
import hashlib


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(b"-" if a is None else a.get().tobytes())
    return h.hexdigest()[:16]


def main():
    import cupy as cp

    import cupy_moe
    from cupy_moe.testing import make_moe_inputs, make_grad_output, make_sol080_inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--layer-T", default="1000,8192")
    ap.add_argument("--sol080-T", default="192,1321,8192")
    args = ap.parse_args()
    cfg = cupy_moe.MoEConfig.glm45_air()
    for T in map(int, filter(None, args.layer_T.split(","))):
        _, ctx = cupy_moe.moe_forward(**make_moe_inputs(cfg, T, seed=0, xp=cp), config=cfg)
        dy = make_grad_output(cfg, T, seed=1, xp=cp)
        grads = cupy_moe.moe_backward(dy, ctx)
        print(f"layer T={T}: {digest(grads)} " + " ".join(f"{n}={digest([g])}" for n, g in grads._asdict().items()))
    for T in map(int, filter(None, args.sol080_T.split(","))):
        outs = cupy_moe.sol080_backward(**make_sol080_inputs(T, seed=T, xp=cp))
        print(f"sol080 T={T}: {digest(outs)}")


if __name__ == "__main__":
    main()
