#!/usr/bin/env python3
"""CUDA driver conformance suite: ordinary CUDA kernels, checked against NumPy.

Runs the kernels in kernels/conformance/*.cu (compiled to the committed *.ptx by build.sh)
through the CUDA driver API with ctypes, and compares every result with what NumPy (or exact
Python arithmetic) computes from the same seeded inputs. It is written against the driver API
alone, so the same script checks tandem's CPU stand-in (crates/tandem-cuda-emu, built as a
libcuda.so.1) and NVIDIA's real driver on a GPU machine.

Usage:
    # NumPy: not installed system-wide here; install it once beside the build outputs
    # (this script adds <repo>/target/conformance-python to sys.path by itself; PYTHONPATH works
    # too):
    python3 -m pip install --target target/conformance-python numpy

    # Against the stand-in (a folder holding it as libcuda.so.1):
    LD_LIBRARY_PATH=target/cuda-emu/lib64 python3 kernels/conformance/check.py [--strict]
    # or name the library directly:
    python3 kernels/conformance/check.py --libcuda /tmp/conf-emu/libcuda.so.1
    # Against the real driver (libcuda.so.1 on the normal loader path):
    python3 kernels/conformance/check.py --strict

Options: --strict also runs the error checks (bad launch configuration, missing kernel,
unsupported PTX version, double free, and last an illegal address, which poisons the context);
--strict-only runs only those; --only SUBSTRING runs the checks whose name contains it;
--list prints the check names.

Output: one line per comparison, `ok   <name>: <what>  [<seconds>s]` or
`FAIL <name>: <what>: <why>`; the exit status is 1 if anything failed, 2 if the suite could not start.

How results are compared (each check's docstring says which and why):
  * exact (bit-for-bit, NaN matching NaN): integer results, and floating-point results that
    IEEE 754 rounds exactly (add, sub, mul, div, sqrt, fma, conversions) where NumPy or
    Fraction computes the same correctly rounded operation;
  * an absolute bound scaled by the sum of magnitudes: sums taken in another order;
  * ulps against an f64 reference: the approximate f32 functions, with the bounds the CUDA C++
    Programming Guide (Mathematical Functions appendix) documents for each.
"""

import argparse
import ctypes
import os
import sys
import time
import zlib
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_LOCAL_NUMPY = os.path.join(ROOT, "target", "conformance-python")
if os.path.isdir(_LOCAL_NUMPY):
    sys.path.insert(0, _LOCAL_NUMPY)
try:
    import numpy as np
except ImportError:  # pragma: no cover - a setup problem, not a check
    sys.stderr.write(
        "check.py needs NumPy: python3 -m pip install --target target/conformance-python numpy\n"
    )
    sys.exit(2)

SEED = 20261130

# CUresult names, for when cuGetErrorName itself is missing or fails.
ERROR_NAMES = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    218: "CUDA_ERROR_INVALID_PTX",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    999: "CUDA_ERROR_UNKNOWN",
}

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_INVALID_ADDRESS_SPACE = 717

# How far past a 256-byte allocation the illegal-address check stores.
ILLEGAL_OFFSET_BYTES = 1 << 30

c_void_p = ctypes.c_void_p
c_uint = ctypes.c_uint
c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_u64 = ctypes.c_uint64


class CudaError(Exception):
    def __init__(self, call, code, name):
        super().__init__(f"{call} returned {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class Driver:
    """The driver API functions the suite uses, from one libcuda."""

    SIGNATURES = {
        "cuInit": [c_uint],
        "cuDriverGetVersion": [ctypes.POINTER(c_int)],
        "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
        "cuDeviceGetName": [ctypes.c_char_p, c_int, c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(c_void_p), c_int],
        "cuDevicePrimaryCtxRelease_v2": [c_int],
        "cuDevicePrimaryCtxRelease": [c_int],
        "cuCtxSetCurrent": [c_void_p],
        "cuCtxSynchronize": [],
        "cuModuleLoadData": [ctypes.POINTER(c_void_p), c_void_p],
        "cuModuleUnload": [c_void_p],
        "cuModuleGetFunction": [ctypes.POINTER(c_void_p), c_void_p, ctypes.c_char_p],
        "cuMemAlloc_v2": [ctypes.POINTER(c_u64), c_size_t],
        "cuMemFree_v2": [c_u64],
        "cuMemcpyHtoD_v2": [c_u64, c_void_p, c_size_t],
        "cuMemcpyDtoH_v2": [c_void_p, c_u64, c_size_t],
        "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                           c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_void_p)],
        "cuGetErrorName": [c_int, ctypes.POINTER(ctypes.c_char_p)],
    }

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.fns = {}
        for name, argtypes in self.SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                continue
            fn.argtypes = argtypes
            fn.restype = c_int
            self.fns[name] = fn

    def has(self, name):
        return name in self.fns

    def raw(self, name, *args):
        """Calls `name` and returns its CUresult."""
        fn = self.fns.get(name)
        if fn is None:
            raise CudaError(name, -1, f"no symbol {name} in {self.path}")
        return fn(*args)

    def __call__(self, name, *args):
        """Calls `name`, raising CudaError unless it returns CUDA_SUCCESS."""
        code = self.raw(name, *args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def error_name(self, code):
        if "cuGetErrorName" in self.fns:
            out = ctypes.c_char_p()
            if self.fns["cuGetErrorName"](code, ctypes.byref(out)) == 0 and out.value:
                return out.value.decode()
        return ERROR_NAMES.get(code, f"CUresult {code}")

    def describe(self, code):
        return f"{self.error_name(code)} ({code})"


class Buffer:
    def __init__(self, ptr, nbytes):
        self.ptr = ptr
        self.nbytes = nbytes
        self.freed = False


class Session:
    """The current context, its modules and this check's allocations."""

    def __init__(self, cu):
        self.cu = cu
        self.modules = {}
        self.buffers = []

    # ---- modules ----
    def module(self, name):
        if name not in self.modules:
            with open(os.path.join(HERE, name + ".ptx"), "rb") as f:
                self.modules[name] = self.load_ptx(f.read())
        return self.modules[name]

    def load_ptx(self, text):
        image = ctypes.create_string_buffer(text + b"\0")
        module = c_void_p()
        self.cu("cuModuleLoadData", ctypes.byref(module), ctypes.cast(image, c_void_p))
        return module

    def function(self, module_name, kernel):
        fn = c_void_p()
        self.cu("cuModuleGetFunction", ctypes.byref(fn), self.module(module_name),
                kernel.encode())
        return fn

    # ---- memory ----
    def alloc(self, nbytes):
        ptr = c_u64()
        self.cu("cuMemAlloc_v2", ctypes.byref(ptr), max(int(nbytes), 1))
        buf = Buffer(ptr.value, int(nbytes))
        self.buffers.append(buf)
        return buf

    def to_device(self, array):
        array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes)
        if array.nbytes:
            self.cu("cuMemcpyHtoD_v2", buf.ptr, array.ctypes.data_as(c_void_p), array.nbytes)
        return buf

    def zeros(self, count, dtype):
        return self.to_device(np.zeros(count, dtype=dtype))

    def from_device(self, buf, dtype, count=None):
        dtype = np.dtype(dtype)
        if count is None:
            count = buf.nbytes // dtype.itemsize
        out = np.empty(count, dtype=dtype)
        if out.nbytes:
            self.cu("cuMemcpyDtoH_v2", out.ctypes.data_as(c_void_p), buf.ptr, out.nbytes)
        return out

    def free_all(self):
        for buf in self.buffers:
            if not buf.freed:
                buf.freed = True
                self.cu.raw("cuMemFree_v2", buf.ptr)
        self.buffers = []

    # ---- launches ----
    @staticmethod
    def params(args):
        """kernelParams: an array of void* each pointing at one argument's value."""
        values = []
        for arg in args:
            if isinstance(arg, Buffer):
                values.append(c_u64(arg.ptr))
            elif isinstance(arg, (ctypes._SimpleCData, ctypes.Structure)):
                values.append(arg)
            else:
                raise TypeError(f"kernel argument {arg!r}: pass a Buffer or a ctypes value")
        array = (c_void_p * max(len(values), 1))(
            *[ctypes.cast(ctypes.pointer(v), c_void_p) for v in values])
        return array, values

    def launch_raw(self, fn, grid, block, args, shared=0):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        array, keep = self.params(args)
        code = self.cu.raw("cuLaunchKernel", fn, *grid, *block, shared, None, array, None)
        del keep
        return code

    def launch(self, fn, grid, block, args, shared=0):
        code = self.launch_raw(fn, grid, block, args, shared)
        if code != CUDA_SUCCESS:
            raise CudaError("cuLaunchKernel", code, self.cu.error_name(code))
        self.cu("cuCtxSynchronize")


# ---------------------------------------------------------------------------------------------
# Comparisons. Each returns None when the result is right, else a short reason.


def _first_bad(bad, got, want, extra=None):
    idx = np.flatnonzero(bad)
    i = idx[0]
    where = f"index {i}" if extra is None else extra(i)
    return f"{len(idx)} of {bad.size} differ; first at {where}: got {got.flat[i]!r}, want {want.flat[i]!r}"


def compare_exact(got, want, extra=None):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype.kind == "f":
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        # +0 and -0 compare equal above; require the same sign of zero too.
        same &= ~((got == 0) & (want == 0) & (np.signbit(got) != np.signbit(want)))
    else:
        same = got == want
    if same.all():
        return None
    return _first_bad(~same, got, want, extra)


def compare_abs(got, want, bound, extra=None):
    """|got - want| <= bound, elementwise (bound broadcasts)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), want.shape)
    err = np.abs(got - want)
    bad = ~(err <= bound)
    if not bad.any():
        return None
    i = np.flatnonzero(bad)[0]
    return (f"{bad.sum()} of {bad.size} outside the bound; first at index {i}: got {got.flat[i]!r}, "
            f"want {want.flat[i]!r}, |error| {err.flat[i]:.3g} > {bound.flat[i]:.3g}")


def ulp_f32(ref):
    """The f32 ulp at each exact value `ref` (f64): 2^(e - 24) where |ref| is in [2^(e-1), 2^e)."""
    _, e = np.frexp(np.abs(ref))
    return np.ldexp(1.0, np.maximum(e, -125) - 24)


def compare_ulps(got, ref, bound_ulps, inputs=None):
    """|got - ref| <= bound_ulps f32 ulps of the exact value (ref in f64)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    err = np.abs(got - ref) / ulp_f32(ref)
    bound = np.broadcast_to(np.asarray(bound_ulps, dtype=np.float64), ref.shape)
    bad = ~(err <= bound + 1e-6)
    worst = float(np.max(err)) if err.size else 0.0
    if not bad.any():
        return None, worst
    i = np.flatnonzero(bad)[0]
    at = "" if inputs is None else f" (input {inputs[i]!r})"
    return (f"{bad.sum()} of {bad.size} outside the bound; first at index {i}{at}: got "
            f"{got[i]!r}, want {ref[i]!r}, {err[i]:.2f} ulp > {bound[i]:.2f}"), worst


def round_f32(value):
    """The f32 nearest the exact rational `value`, ties to even (for fmaf's single rounding)."""
    r = np.float32(float(value))  # within one f32 ulp of the answer
    best = None
    for cand in (np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))):
        if not np.isfinite(cand):
            continue
        d = abs(Fraction(float(cand)) - value)
        even = (int(np.array(cand).view(np.uint32)) & 1) == 0
        key = (d, not even)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def tensor_core_sum(a, b, c):
    """D = A B + C of mma.sync m16n8k16 (a: tiles x 16 x 16, b: tiles x 16 x 8, c: tiles x 16
    x 8, f64 holding the 16-bit and f32 values) as an H200's tensor cores compute it, fitted to
    524,288 of its results (2026-12-04, every one reproduced): the 16 exact products and c are
    aligned to the largest exponent among them (a product's is the sum of its factors'), each
    is cut toward zero below 2^-25 of it, the rest summed exactly and rounded to f32 toward
    zero. NumPy's float64 holds every step exactly (each cut term is an integer below 2^28
    units)."""
    products = a[:, :, None, :] * np.transpose(b, (0, 2, 1))[:, None, :, :]
    exponent = lambda x: np.frexp(x)[1].astype(np.int64) - 1  # floor(log2 |x|)
    product_exp = (exponent(a)[:, :, None, :]
                   + np.transpose(exponent(b), (0, 2, 1))[:, None, :, :])
    none = np.iinfo(np.int64).min // 2
    largest = np.maximum(np.where(products != 0, product_exp, none).max(axis=-1),
                         np.where(c != 0, exponent(c), none))
    unit = np.ldexp(1.0, np.where(largest == none, 0, largest - 25))
    cut = np.trunc(products / unit[..., None]) * unit[..., None]
    exact = cut.sum(axis=-1) + np.trunc(c / unit) * unit
    nearest = exact.astype(np.float32)
    past = np.abs(nearest.astype(np.float64)) > np.abs(exact)
    return np.where(past, np.nextafter(nearest, np.float32(0)), nearest)


# ---------------------------------------------------------------------------------------------
# The checks.

CHECKS = []
STRICT = []


def check(fn):
    CHECKS.append(fn)
    return fn


def strict(fn):
    STRICT.append(fn)
    return fn


def u32(values):
    """The low 32 bits of integers (NumPy or Python, signed or not) as u32."""
    values = np.asarray(values)
    if values.dtype == np.uint64:
        return (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return np.asarray(np.asarray(values, dtype=np.int64) & 0xFFFFFFFF, dtype=np.uint32)


@check
def vector_add(s, rng, report):
    """c = a + b in f32: exact (one IEEE rounding, which NumPy's f32 add does too)."""
    fn = s.function("vector_add", "vector_add")
    n = 100_003
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db = s.to_device(a), s.to_device(b)
    for label, grid, block in (("grid-stride 40x256", 40, 256),
                               ("one element a thread 391x256", (n + 255) // 256, 256),
                               ("odd block 7x100", 7, 100)):
        dc = s.zeros(n, np.float32)
        s.launch(fn, (grid,), (block,), [da, db, dc, c_int(n)])
        report(f"n={n} {label}", compare_exact(s.from_device(dc, np.float32), a + b))


@check
def transpose(s, rng, report):
    """out = in.T through 32x33 shared tiles: exact (values are only moved)."""
    fn = s.function("transpose", "transpose")
    for rows, cols in ((100, 70), (64, 64), (1, 33), (37, 1)):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        din = s.to_device(x)
        dout = s.to_device(np.full(rows * cols, np.nan, dtype=np.float32))
        grid = ((cols + 31) // 32, (rows + 31) // 32)
        s.launch(fn, grid, (32, 8), [din, dout, c_int(rows), c_int(cols)])
        got = s.from_device(dout, np.float32).reshape(cols, rows)
        report(f"{rows}x{cols}", compare_exact(got, x.T))


def _block_of(n, grid, block):
    """For each i < n, the block whose grid-stride share element i is in."""
    return (np.arange(n) // block) % grid


@check
def reduce_sum(s, rng, report):
    """Warp-shuffle block sums and their atomicAdd total.

    i32: exact. f32: the kernel sums in its own order (per-thread runs, then two 5-level shuffle
    trees, then atomics in any block order); the error of such a sum is at most
    (terms + 10) * 2^-24 * sum|x| in the worst case, about 2e-6 * sum|x| here, so each sum is
    compared with the exact (f64) sum to 1e-5 * sum|x| of the summed elements.
    """
    f32 = s.function("reduce", "reduce_sum_f32")
    i32 = s.function("reduce", "reduce_sum_i32")
    n = 50_000
    for grid, block in ((13, 256), (5, 96)):
        x = (rng.standard_normal(n) * 10).astype(np.float32)
        owner = _block_of(n, grid, block)
        want_blocks = np.bincount(owner, weights=x.astype(np.float64), minlength=grid)
        mags = np.bincount(owner, weights=np.abs(x.astype(np.float64)), minlength=grid)
        dx, dblocks, dtotal = s.to_device(x), s.zeros(grid, np.float32), s.zeros(1, np.float32)
        s.launch(f32, (grid,), (block,), [dx, c_int(n), dblocks, dtotal])
        report(f"f32 n={n} {grid}x{block} block sums (|err| <= 1e-5 sum|x|)",
               compare_abs(s.from_device(dblocks, np.float32), want_blocks, 1e-5 * mags))
        report(f"f32 n={n} {grid}x{block} atomicAdd total (|err| <= 1e-5 sum|x|)",
               compare_abs(s.from_device(dtotal, np.float32), [want_blocks.sum()],
                           1e-5 * mags.sum()))

        xi = rng.integers(-1000, 1001, n).astype(np.int32)
        want_i = np.bincount(owner, weights=xi, minlength=grid).astype(np.int64).astype(np.int32)
        dx, dblocks, dtotal = s.to_device(xi), s.zeros(grid, np.int32), s.zeros(1, np.int32)
        s.launch(i32, (grid,), (block,), [dx, c_int(n), dblocks, dtotal])
        report(f"i32 n={n} {grid}x{block} block sums (exact)",
               compare_exact(s.from_device(dblocks, np.int32), want_i))
        report(f"i32 n={n} {grid}x{block} atomicAdd total (exact)",
               compare_exact(s.from_device(dtotal, np.int32), np.array([xi.astype(np.int64).sum()],
                                                                      dtype=np.int32)))


@check
def scan(s, rng, report):
    """Per-block inclusive scans (dynamic shared memory).

    i32: exact. f32: Hillis-Steele adds in a tree of depth log2(block) instead of left to
    right; each output is compared with the exact (f64) prefix sum to 1e-5 times the prefix sum
    of |x| (the worst-case bound is about log2(block) * 2^-24 = 5e-7 of it).
    """
    for kernel, dtype, n, block in (("scan_inclusive_i32", np.int32, 5000, 512),
                                    ("scan_inclusive_i32", np.int32, 1000, 1024),
                                    ("scan_inclusive_f32", np.float32, 3000, 256)):
        fn = s.function("scan", kernel)
        if dtype == np.int32:
            x = rng.integers(-1000, 1001, n).astype(np.int32)
        else:
            x = rng.standard_normal(n).astype(np.float32)
        grid = (n + block - 1) // block
        seg = np.arange(n) // block
        want = np.empty(n, dtype=np.float64)
        mags = np.empty(n, dtype=np.float64)
        for b in range(grid):
            part = x[seg == b].astype(np.float64)
            want[seg == b] = np.cumsum(part)
            mags[seg == b] = np.cumsum(np.abs(part))
        dx, dout = s.to_device(x), s.zeros(n, dtype)
        s.launch(fn, (grid,), (block,), [dx, dout, c_int(n)],
                 shared=2 * block * np.dtype(dtype).itemsize)
        got = s.from_device(dout, dtype)
        label = f"{kernel} n={n} {grid}x{block}"
        if dtype == np.int32:
            report(label + " (exact)", compare_exact(got, want.astype(np.int64).astype(np.int32)))
        else:
            report(label + " (|err| <= 1e-5 prefix sum|x|)", compare_abs(got, want, 1e-5 * mags))


@check
def histogram(s, rng, report):
    """256-bin byte histogram with shared and global atomicAdd: exact."""
    fn = s.function("histogram", "histogram256")
    n = 99_999  # not a multiple of 4: u8 loads up to an odd end
    # Skewed, so that many threads hit the same bins at once.
    data = np.concatenate([
        rng.integers(0, 256, n // 2),
        np.clip(rng.normal(128, 6, n - n // 2), 0, 255).astype(np.int64),
    ]).astype(np.uint8)
    rng.shuffle(data)
    for grid, block in ((8, 256), (3, 1024)):
        dd, dbins = s.to_device(data), s.zeros(256, np.uint32)
        s.launch(fn, (grid,), (block,), [dd, c_int(n), dbins])
        report(f"n={n} {grid}x{block} (exact)",
               compare_exact(s.from_device(dbins, np.uint32),
                             np.bincount(data, minlength=256).astype(np.uint32)))


def f64_terms(s, rng, report, name, terms_of):
    """Runs f64 kernel `name` on 20,000 x in [0, 10] (with 0, 1e-300, 0.5, 1 and 10 first),
    a = 1.25 and b = -0.5, and compares its y with the sum of `terms_of(x, a, b)` to 1e-14
    times the sum of the terms' magnitudes (fma(a, x, b)'s product counted on its own)."""
    fn = s.function(name, name)
    n = 20_000
    x = np.concatenate([[0.0, 1e-300, 0.5, 1.0, 10.0], rng.uniform(0, 10, n - 5)])
    a, b = 1.25, -0.5
    dx, dy = s.to_device(x), s.zeros(n, np.float64)
    s.launch(fn, (20,), (128,), [dx, dy, c_int(n), ctypes.c_double(a), ctypes.c_double(b)])
    terms = terms_of(x, a, b)
    want = sum(terms)
    scale = sum(np.abs(t) for t in terms) + np.abs(a * x) + abs(b)
    report(f"n={n} (|err| <= 1e-14 * sum of |terms|)",
           compare_abs(s.from_device(dy, np.float64), want, 1e-14 * scale))


@check
def f64_math(s, rng, report):
    """y = sqrt(x) exp(x/10) + log1p(x) + fma(a, x, b) + sin(x) cos(x) in f64.

    libdevice's exp and log1p are within 1 ulp and sin and cos within 2 ulp (CUDA C++
    Programming Guide, double-precision functions), NumPy's within 1 ulp, and the kernel's fma
    skips one rounding: the difference is a few ulps of the largest term. Compared to 1e-14
    times the sum of the terms' magnitudes (about 45 ulps of it; a wrong term is off by far
    more).
    """
    f64_terms(s, rng, report, "f64_math", lambda x, a, b: [
        np.sqrt(x) * np.exp(x / 10), np.log1p(x), a * x + b, np.sin(x) * np.cos(x)])


@check
def f64_explog(s, rng, report):
    """y = sqrt(x) exp(x/10) + log1p(x) + fma(a, x, b) + pow(x, 1.5)/8 + tanh(x - 5) + cbrt(x)
    + log(x + 2) in f64, with no trigonometry (so no constant tables in the PTX). libdevice's
    exp, log1p, log, cbrt, tanh are within 1 ulp and pow within 2 (CUDA C++ Programming Guide);
    compared to 1e-14 times the sum of the terms' magnitudes, as f64_math.
    """
    f64_terms(s, rng, report, "f64_explog", lambda x, a, b: [
        np.sqrt(x) * np.exp(x / 10), np.log1p(x), a * x + b, np.power(x, 1.5) / 8,
        np.tanh(x - 5), np.cbrt(x), np.log(x + 2)])


def _spread(rng, n, lo, hi, dtype):
    """Random signs and mantissas with exponents spread over [lo, hi)."""
    m = rng.uniform(1, 2, n) * rng.choice([-1.0, 1.0], n)
    return (m * np.exp2(rng.integers(lo, hi, n))).astype(dtype)


@check
def ieee_exact(s, rng, report):
    """Operations IEEE 754 rounds exactly, compared bit for bit.

    fma and fmaf against the exact rational a*b+c rounded once (Fraction); a/b, sqrt, a*b+c
    with two roundings, and conversions against NumPy, which rounds the same way.
    """
    fn = s.function("ieee_exact", "ieee_exact")
    n = 4096
    a, b, c = (_spread(rng, n, -30, 30, np.float64) for _ in range(3))
    af, bf, cf = (_spread(rng, n, -20, 20, np.float32) for _ in range(3))
    # Cancellation cases: c = -a*b rounded, so fma keeps the product's rounding error.
    a[:64] = rng.standard_normal(64)
    b[:64] = rng.standard_normal(64)
    c[:64] = -(a[:64] * b[:64])
    af[:64] = rng.standard_normal(64).astype(np.float32)
    bf[:64] = rng.standard_normal(64).astype(np.float32)
    cf[:64] = -(af[:64] * bf[:64])
    bufs = [s.to_device(v) for v in (a, b, c, af, bf, cf)]
    d64, d32 = s.zeros(5 * n, np.float64), s.zeros(6 * n, np.float32)
    s.launch(fn, (8,), (128,), bufs + [d64, d32, c_int(n)])
    g64 = s.from_device(d64, np.float64).reshape(5, n)
    g32 = s.from_device(d32, np.float32).reshape(6, n)
    fma64 = np.array([float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)])
    fma32 = np.array([round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                      for x, y, z in zip(af, bf, cf)], dtype=np.float32)
    report("f64 fma(a, b, c) (exact, single rounding)", compare_exact(g64[0], fma64))
    report("f64 a / b (exact)", compare_exact(g64[1], a / b))
    report("f64 sqrt(|a|) (exact)", compare_exact(g64[2], np.sqrt(np.abs(a))))
    report("f64 a * b + c, two roundings (exact)", compare_exact(g64[3], a * b + c))
    report("f32 -> f64 (exact)", compare_exact(g64[4], af.astype(np.float64)))
    report("f32 fmaf(a, b, c) (exact, single rounding)", compare_exact(g32[0], fma32))
    report("f32 a / b (exact)", compare_exact(g32[1], af / bf))
    report("f32 sqrtf(|a|) (exact)", compare_exact(g32[2], np.sqrt(np.abs(af))))
    report("f32 a * b + c, two roundings (exact)", compare_exact(g32[3], af * bf + cf))
    report("f64 -> f32 round to nearest even (exact)", compare_exact(g32[4], a.astype(np.float32)))
    report("f32 a - b (exact)", compare_exact(g32[5], af - bf))


@check
def approx_f32(s, rng, report):
    """Approximate f32 functions, in ulps of the exact value (an f64 reference), within the
    bounds the CUDA C++ Programming Guide documents (Mathematical Functions appendix):
    __fdividef 2 ulp (for 2^-126 <= |y| <= 2^126); __expf 2 + floor(|1.173 x|) ulp; __logf
    absolute 2^-21.41 on [0.5, 2], else 3 ulp; expf 2 ulp; logf 1 ulp; sinf and cosf 2 ulp;
    __sinf absolute 2^-21.41 on [-pi, pi]; rsqrtf 2 ulp. (sinf and cosf: check trig_f32.)
    """
    fn = s.function("approx_f32", "approx_f32")
    n = 8192
    x = rng.uniform(-3.0, 3.0, n).astype(np.float32)
    y = _spread(rng, n, -10, 10, np.float32)
    y[:256] = rng.uniform(0.5, 2.0, 256).astype(np.float32)  # __logf's absolute-error range
    dx, dy, dout = s.to_device(x), s.to_device(y), s.zeros(7 * n, np.float32)
    s.launch(fn, (16,), (128,), [dx, dy, dout, c_int(n)])
    got = s.from_device(dout, np.float32).reshape(7, n)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    ay = np.abs(y64)

    def ulps(label, k, ref, bound):
        why, worst = compare_ulps(got[k], ref, bound)
        report(f"{label} (worst {worst:.2f} ulp)", why)

    ulps("__fdividef(x, y) <= 2 ulp", 0, x64 / y64, 2)
    ulps("__expf(x) <= 2 + floor(|1.173 x|) ulp", 1, np.exp(x64), 2 + np.floor(np.abs(1.173 * x64)))
    in_range = (ay >= 0.5) & (ay <= 2.0)
    ref = np.log(ay)
    report("__logf(|y|) on [0.5, 2] |err| <= 2^-21.41",
           compare_abs(got[2][in_range], ref[in_range], 2.0 ** -21.41))
    why, worst = compare_ulps(got[2][~in_range], ref[~in_range], 3)
    report(f"__logf(|y|) elsewhere <= 3 ulp (worst {worst:.2f} ulp)", why)
    ulps("expf(x) <= 2 ulp", 3, np.exp(x64), 2)
    ulps("logf(|y|) <= 1 ulp", 4, ref, 1)
    report("__sinf(x) on [-3, 3] |err| <= 2^-21.41",
           compare_abs(got[5], np.sin(x64), 2.0 ** -21.41))
    ulps("rsqrtf(|y|) <= 2 ulp", 6, 1.0 / np.sqrt(ay), 2)


@check
def trig_f32(s, rng, report):
    """sinf and cosf (libdevice, with its Payne-Hanek tables for large arguments) within the
    2 ulp the CUDA C++ Programming Guide documents, in ulps of the exact (f64) value; the
    arguments reach 1e6, past the fast reduction's range."""
    fn = s.function("f64_math", "trig_f32")
    n = 4096
    x = rng.uniform(-3.0, 3.0, n).astype(np.float32)
    x[n // 2:] = (rng.uniform(-1e6, 1e6, n - n // 2)).astype(np.float32)
    dx, dout = s.to_device(x), s.zeros(2 * n, np.float32)
    s.launch(fn, (8,), (128,), [dx, dout, c_int(n)])
    got = s.from_device(dout, np.float32).reshape(2, n)
    x64 = x.astype(np.float64)
    for k, (name, ref) in enumerate((("sinf(x)", np.sin(x64)), ("cosf(x)", np.cos(x64)))):
        why, worst = compare_ulps(got[k], ref, 2, inputs=x)
        report(f"{name} <= 2 ulp, |x| up to 1e6 (worst {worst:.2f} ulp)", why)


@check
def warp_ops(s, rng, report):
    """Shuffles (xor, up, idx, down, a half-warp mask) and votes: exact (integers)."""
    fn = s.function("warp_ops", "warp_ops")
    n, block = 4096, 128
    v = rng.integers(-100, 101, n).astype(np.int32)
    dv, dout, dvotes = s.to_device(v), s.zeros(5 * n, np.int32), s.zeros(3 * (n // 32), np.uint32)
    s.launch(fn, (n // block,), (block,), [dv, dout, dvotes, c_int(n)])
    got = s.from_device(dout, np.int32).reshape(5, n // 32, 32)
    votes = s.from_device(dvotes, np.uint32).reshape(n // 32, 3)
    w = v.reshape(n // 32, 32).astype(np.int64)
    lane = np.arange(32)
    report("__shfl_xor_sync butterfly warp sum",
           compare_exact(got[0], np.repeat(w.sum(1, keepdims=True), 32, 1).astype(np.int32)))
    report("__shfl_up_sync inclusive warp scan", compare_exact(got[1], np.cumsum(w, 1).astype(np.int32)))
    report("__shfl_sync from lane (7 lane + 3) % 32",
           compare_exact(got[2], w[:, (lane * 7 + 3) % 32].astype(np.int32)))
    down = np.where(lane + 5 < 32, w[:, np.minimum(lane + 5, 31)], w)
    report("__shfl_down_sync by 5 (own value past lane 31)", compare_exact(got[3], down.astype(np.int32)))
    half = np.where(lane < 16, w[:, :16].sum(1, keepdims=True), -1)
    report("__shfl_xor_sync with mask 0x0000ffff", compare_exact(got[4], half.astype(np.int32)))
    ballot = ((w > 0).astype(np.uint64) << lane.astype(np.uint64)).sum(1).astype(np.uint32)
    report("__ballot_sync(v > 0)", compare_exact(votes[:, 0], ballot))
    every = (w > -90).all(1).astype(np.uint32)
    some = (w > 95).any(1).astype(np.uint32)
    report(f"__all_sync(v > -90) ({every.sum()} of {every.size} warps true)",
           compare_exact(votes[:, 1], every))
    report(f"__any_sync(v > 95) ({some.sum()} of {some.size} warps true)",
           compare_exact(votes[:, 2], some))


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def _int_inputs(rng):
    """Signed a, b (b != 0, no INT_MIN / -1) and unsigned ua, ub (ub != 0), as int64."""
    n = 4096
    a = rng.integers(-2**31, 2**31, n, dtype=np.int64)
    a[n // 2:] = rng.integers(-300, 301, n - n // 2)
    b = rng.integers(-2**31, 2**31, n, dtype=np.int64)
    b[: n // 4] = rng.integers(-40, 41, n // 4)
    ua = rng.integers(0, 2**32, n, dtype=np.int64)
    ub = rng.integers(1, 2**32, n, dtype=np.int64)
    ub[: n // 4] = rng.integers(1, 100, n // 4)
    a[0], ua[0] = 0, 0
    a[1], ua[1] = -2**31, 2**32 - 1
    a[2], ua[2] = 2**31 - 1, 1
    a[3], b[3] = -7, 2
    a[4], b[4] = 7, -2
    b[b == 0] = 3
    b[(a == -2**31) & (b == -1)] = 5
    return a, b, ua, ub


@check
def int_ops(s, rng, report):
    """Integer division, remainders, min/max, shifts, 64-bit division and integer atomics:
    exact (NumPy integer arithmetic in 64 bits, truncated to 32)."""
    fn = s.function("int_ops", "int_ops")
    a, b, ua, ub = _int_inputs(rng)
    n = a.size
    bufs = [s.to_device(a.astype(np.int32)), s.to_device(b.astype(np.int32)),
            s.to_device(ua.astype(np.uint32)), s.to_device(ub.astype(np.uint32))]
    dout = s.zeros(11 * n, np.uint32)
    accs = [s.to_device(np.array([-2**31], np.int32)), s.to_device(np.array([2**31 - 1], np.int32)),
            s.zeros(1, np.uint32), s.zeros(1, np.uint32)]
    s.launch(fn, (6,), (256,), bufs + [dout, c_int(n)] + accs)
    got = s.from_device(dout, np.uint32).reshape(11, n)
    q = _trunc_div(a, b)
    sh = ub & 31
    prod = ua.astype(np.uint64) * ub.astype(np.uint64)  # < 2^64: exact in u64, not in i64
    want = [
        ("a / b", q), ("a % b", a - q * b), ("ua / ub", ua // ub), ("ua % ub", ua % ub),
        ("min (signed)", np.minimum(a, b)), ("max (unsigned)", np.maximum(ua, ub)),
        ("a >> s (arithmetic)", a >> sh), ("ua >> s (logical)", ua >> sh),
        ("ua * ub (low 32)", prod & np.uint64(0xFFFFFFFF)),
        ("64-bit signed division", _trunc_div(a * 1000003, b)),
        ("64-bit unsigned remainder", ((ua << 20) | ub) % ub),
    ]
    for k, (name, w) in enumerate(want):
        report(f"{name} (exact)", compare_exact(got[k], u32(w)))
    acc = [s.from_device(buf, np.uint32)[0] for buf in accs]
    orv = 0
    xorv = 0
    for value in ua:
        orv |= 1 << (int(value) & 31)
        xorv ^= int(value)
    report("atomicMax / atomicMin / atomicOr / atomicXor (exact)",
           compare_exact(np.array(acc, dtype=np.uint32), u32([a.max(), a.min(), orv, xorv])))


@check
def bit_ops(s, rng, report):
    """__popc, __clz, __brev, __ffs, __umulhi: exact (bit by bit in NumPy)."""
    fn = s.function("bit_ops", "bit_ops")
    a, _, ua, ub = _int_inputs(rng)
    n = a.size
    bufs = [s.to_device(a.astype(np.int32)), s.to_device(ua.astype(np.uint32)),
            s.to_device(ub.astype(np.uint32))]
    dout = s.zeros(5 * n, np.uint32)
    s.launch(fn, (6,), (256,), bufs + [dout, c_int(n)])
    got = s.from_device(dout, np.uint32).reshape(5, n)
    bits = [(ua >> k) & 1 for k in range(32)]
    abits = [((a & 0xFFFFFFFF) >> k) & 1 for k in range(32)]
    high = np.full(n, -1)
    low = np.full(n, -1)
    for k in range(32):
        high = np.where(bits[k] == 1, k, high)
    for k in reversed(range(32)):
        low = np.where(abits[k] == 1, k, low)
    prod = ua.astype(np.uint64) * ub.astype(np.uint64)
    want = [
        ("__popc", sum(bits)), ("__clz", 31 - high),
        ("__brev", sum(bit << (31 - k) for k, bit in enumerate(bits))),
        ("__ffs", low + 1), ("__umulhi", prod >> np.uint64(32)),
    ]
    for k, (name, w) in enumerate(want):
        report(f"{name} (exact)", compare_exact(got[k], u32(w)))


def _saturate(values, lo, hi):
    """Python ints of `values` (floats) clamped to [lo, hi], NaN -> 0, as PTX's cvt does."""
    out = []
    for v in values:
        v = float(v)
        if v != v:
            out.append(0)
        elif v == float("inf") or v >= hi:
            out.append(hi)
        elif v == float("-inf") or v <= lo:
            out.append(lo)
        else:
            out.append(int(v))
    return np.array(out, dtype=np.int64)


def _int_to_f32_directed(k, toward):
    """k (int64) to f32 rounded toward zero ('z') or up ('u'), exactly."""
    f = k.astype(np.float32)
    exact = f.astype(np.float64)
    k64 = k.astype(np.float64)  # exact for 32-bit ints
    if toward == "z":
        too_far = np.abs(exact) > np.abs(k64)
        return np.where(too_far, np.nextafter(f, np.float32(0)), f)
    too_low = exact < k64
    return np.where(too_low, np.nextafter(f, np.float32(np.inf)), f)


@check
def conversions(s, rng, report):
    """Float <-> integer conversions with explicit rounding and fminf/fmaxf: exact. PTX
    defines the out-of-range cases: conversions to integers saturate (infinities included).
    NaN inputs are skipped in the float-to-integer rows (see below)."""
    fn = s.function("conversions", "conversions")
    specials = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 3e9, -3e9,
                2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0, 4294967040.0,
                4294967296.0, 1e20, -1e20, np.inf, -np.inf, np.nan, -0.0, 0.0, 8388609.0,
                16777217.0, -1e-30, 1e-30, 0.99999994]
    n = 2048
    x = rng.uniform(-1e4, 1e4, n).astype(np.float32)
    x[n // 2: n // 2 + 512] = (rng.integers(-1000, 1000, 512) + 0.5).astype(np.float32)
    x[: len(specials)] = np.array(specials, dtype=np.float32)
    d = rng.uniform(-1e4, 1e4, n)
    d[n // 2: n // 2 + 512] = rng.integers(-1000, 1000, 512) + 0.5
    d[: len(specials)] = specials
    d[len(specials)] = 2147483647.5
    d[len(specials) + 1] = -2147483648.5
    k = rng.integers(-2**31, 2**31, n, dtype=np.int64)
    k[:6] = [2**31 - 1, -2**31, 16777217, -16777217, 33554435, 0]
    y = rng.uniform(-1e4, 1e4, n).astype(np.float32)
    y[len(specials): len(specials) + 8] = np.nan  # x finite, y NaN
    bufs = [s.to_device(x), s.to_device(d), s.to_device(k.astype(np.int32)), s.to_device(y)]
    dints, dfloats = s.zeros(9 * n, np.uint32), s.zeros(8 * n, np.float32)
    s.launch(fn, (4,), (256,), bufs + [dints, dfloats, c_int(n)])
    gi = s.from_device(dints, np.uint32).reshape(9, n)
    gf = s.from_device(dfloats, np.float32).reshape(8, n)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        i32 = (-2**31, 2**31 - 1)
        wide = _saturate(np.floor(x64), -2**63, 2**63 - 1)
        ints = [
            ("__float2int_rn", _saturate(np.rint(x64), *i32)),
            ("__float2int_rz", _saturate(np.trunc(x64), *i32)),
            ("__float2int_rd", _saturate(np.floor(x64), *i32)),
            ("__float2int_ru", _saturate(np.ceil(x64), *i32)),
            ("__float2uint_rn", _saturate(np.rint(x64), 0, 2**32 - 1)),
            ("__double2int_rn", _saturate(np.rint(d), *i32)),
            ("__double2int_rz", _saturate(np.trunc(d), *i32)),
            ("__float2ll_rd low 32 bits", wide & 0xFFFFFFFF),
            ("__float2ll_rd high 32 bits", (wide >> 32) & 0xFFFFFFFF),
        ]
        # NaN to an integer is not defined the same way everywhere: an H200 gives 0 from f32 to
        # a 32-bit integer but 0x80000000(00000000) from f64 or to 64 bits. Not compared.
        defined = ~np.isnan(np.array([x64, x64, x64, x64, x64, d, d, x64, x64]))
        for row, (name, want) in enumerate(ints):
            keep = defined[row]
            report(f"{name} (exact, saturating; NaN inputs not compared)",
                   compare_exact(gi[row][keep], u32(want)[keep],
                                 extra=lambda i, keep=keep: f"index {np.flatnonzero(keep)[i]} "
                                 f"(x={x[keep][i]!r}, d={d[keep][i]!r})"))
        floats = [
            ("(float)int, nearest even", k.astype(np.float32)),
            ("__int2float_rz", _int_to_f32_directed(k, "z")),
            ("__int2float_ru", _int_to_f32_directed(k, "u")),
            ("fminf (NaN operand ignored)", np.fmin(x, y)),
            ("fmaxf (NaN operand ignored)", np.fmax(x, y)),
            ("rintf", np.rint(x)),
            ("floorf", np.floor(x)),
            ("truncf", np.trunc(x)),
        ]
        for row, (name, want) in enumerate(floats):
            report(f"{name} (exact)", compare_exact(gf[row], want.astype(np.float32)))


# The 16-bit formats: stored significand bits and the largest exponent (also the bias).
HALF_FORMATS = {"f16": (10, 15), "bf16": (7, 127)}
HALF_NAN = 0x7FFF


def _half_round(value, fmt, mode):
    """The bits of `value` (a float, or a Fraction with `negative` zero sign given by a float
    0.0 or -0.0) rounded to `fmt` in `mode` ('rn', 'rz', 'rd', 'ru'), by exact rational
    arithmetic: IEEE 754's one rounding, written here independently of the stand-in."""
    man, emax = HALF_FORMATS[fmt]
    inf = (2 * emax + 1) << man
    if isinstance(value, float):
        if value != value:
            return HALF_NAN
        negative = np.signbit(value)
        if value in (float("inf"), float("-inf")):
            return (0x8000 if negative else 0) | inf
        q = Fraction(value)
    else:
        q, negative = value
    sign = 0x8000 if negative else 0
    a = abs(q)
    if a == 0:
        return sign
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    qexp = max(e, 1 - emax) - man
    scaled = a / Fraction(2) ** qexp
    n = scaled.numerator // scaled.denominator
    frac = scaled - n
    away = (mode == "ru" and not negative) or (mode == "rd" and negative)
    if mode == "rn":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and n % 2 == 1)
    else:
        up = away and frac > 0
    m = n + int(up)
    if m == 2 ** (man + 1):
        m, qexp = m // 2, qexp + 1
    if m < 2 ** man:
        return sign | m
    exponent = qexp + man
    if exponent > emax:
        return sign | (inf if mode == "rn" or away else inf - 1)
    return sign | ((exponent + emax) << man) | (m - 2 ** man)


def _half_value(bits, fmt):
    """The value of 16-bit `bits` as a Python float (exact)."""
    if fmt == "bf16":
        return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def _half_arith(op, fmt, a_bits, b_bits, c_bits=0):
    """`a op b` (or fma a * b + c) of 16-bit values, exact, rounded once to nearest even; NaN
    for invalid operations, and IEEE's signs of zero."""
    a, b, c = (_half_value(v, fmt) for v in (a_bits, b_bits, c_bits))
    with np.errstate(invalid="ignore", over="ignore"):
        if op == "add":
            inexact = a + b
        elif op == "mul":
            inexact = a * b
        else:
            inexact = a * b + c
    if inexact != inexact or inexact in (float("inf"), float("-inf")) or \
            any(v in (float("inf"), float("-inf")) for v in (a, b, c)):
        # Infinities and NaN: f64 gets these right (no rounding is involved).
        return _half_round(inexact, fmt, "rn")
    if op == "add":
        exact, zero = Fraction(a) + Fraction(b), a + b
    elif op == "mul":
        exact, zero = Fraction(a) * Fraction(b), a * b
    else:
        exact, zero = Fraction(a) * Fraction(b) + Fraction(c), (a * b) + c
    # An exact zero takes f64's sign (the same IEEE rule: + unless both addends are -0).
    negative = exact < 0 or (exact == 0 and np.signbit(zero))
    return _half_round((exact, negative), fmt, "rn")


def _bf16_rn_by_bits(x):
    """bf16 rounding to nearest even by bit manipulation of the f32 pattern (NaN left NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), HALF_NAN, rounded).astype(np.uint16)


def _lanes(packed):
    return packed & 0xFFFF, packed >> 16


@check
def half_ops(s, rng, report):
    """16-bit floats on sm_90 PTX: conversions in every rounding mode and packed add, mul, fma
    on f16x2 and bf16x2, exact (bit for bit) against rational arithmetic rounded once; the
    round-to-nearest conversions also against NumPy's float16 and bf16 by bit manipulation.
    NaN results are compared as NaN, not by payload (PTX returns the canonical 0x7fff)."""
    fn = s.function("half_ops", "half_ops")
    specials = [1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
                65504.0, 65520.0, 65519.996, 70000.0, -65520.0, 2.0 ** -24, 2.0 ** -25,
                3 * 2.0 ** -26, 1e-8, -3e-5, 6.1e-5, 1e-40, -1e-45, 3.0e38, 3.4028235e38,
                -3.4028235e38, np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0 ** -133, 2.0 ** -134,
                1.5 * 2.0 ** -133, 0.1, -0.1, 1e4, -7.0]
    n = 4096
    def spread(count):
        mags = 2.0 ** rng.uniform(-30, 30, count)
        return (rng.standard_normal(count) * mags).astype(np.float32)
    x, y, z = spread(n), spread(n), spread(n)
    # Values a few ulps of f16 apart, where sums and products tie or overflow.
    near = (rng.integers(-2048, 2048, 1024) * 2.0 ** -10).astype(np.float32)
    x[n // 2: n // 2 + 1024], z[n // 2: n // 2 + 1024] = near, near[::-1]
    x[: len(specials)] = np.array(specials, dtype=np.float32)
    y[len(specials): 2 * len(specials)] = np.array(specials, dtype=np.float32)
    bufs = [s.to_device(x), s.to_device(y), s.to_device(z)]
    dbits, dwide, dpacked = s.zeros(8 * n, np.uint16), s.zeros(2 * n, np.float32), \
        s.zeros(10 * n, np.uint32)
    s.launch(fn, (8,), (128,), bufs + [dbits, dwide, dpacked, c_int(n)])
    gb = s.from_device(dbits, np.uint16).reshape(8, n)
    gw = s.from_device(dwide, np.float32).reshape(2, n)
    gp = s.from_device(dpacked, np.uint32).reshape(10, n)

    def same_bits(got, want, fmt):
        nan_got = np.array([np.isnan(_half_value(int(v), fmt)) for v in got])
        nan_want = np.array([np.isnan(_half_value(int(v), fmt)) for v in want])
        return compare_exact(np.where(nan_got, HALF_NAN, got), np.where(nan_want, HALF_NAN, want),
                             extra=lambda i: f"index {i} (x={x[i]!r}, y={y[i]!r}, z={z[i]!r})")

    ref = {}
    for row, (fmt, mode) in enumerate([(f, m) for f in ("f16", "bf16")
                                       for m in ("rn", "rz", "rd", "ru")]):
        want = np.array([_half_round(float(v), fmt, mode) for v in x], dtype=np.uint16)
        ref[fmt, mode] = want
        report(f"cvt.{mode.replace('rd', 'rm').replace('ru', 'rp')}.{fmt}.f32 (exact)",
               same_bits(gb[row], want, fmt))
    with np.errstate(over="ignore"):
        as_numpy = x.astype(np.float16).view(np.uint16)
    report("cvt.rn.f16.f32 against NumPy's float16", same_bits(gb[0], as_numpy, "f16"))
    report("cvt.rn.bf16.f32 against bf16 by bit manipulation",
           same_bits(gb[4], _bf16_rn_by_bits(x), "bf16"))
    for row, fmt in enumerate(("f16", "bf16")):
        want = np.array([_half_value(_half_round(float(v), fmt, "rz"), fmt) for v in y],
                        dtype=np.float32)
        report(f"cvt.f32.{fmt} of y toward zero (exact)", compare_exact(gw[row], want))

    for base, fmt in ((0, "f16"), (5, "bf16")):
        h_lo = np.array([_half_round(float(v), fmt, "rn") for v in x])
        h_hi = np.array([_half_round(float(v), fmt, "rn") for v in y])
        g_lo = np.array([_half_round(float(v), fmt, "rn") for v in z])
        g_hi = h_lo
        for row, (lo, hi) in ((base, (h_lo, h_hi)), (base + 1, (g_lo, g_hi))):
            got_lo, got_hi = _lanes(gp[row])
            report(f"cvt.rn.{fmt}x2.f32, {'h' if row == base else 'g'} lanes (exact)",
                   same_bits(np.concatenate([got_lo, got_hi]), np.concatenate([lo, hi]), fmt))
        sums = [np.array([_half_arith("add", fmt, a, b) for a, b in zip(hh, gg)])
                for hh, gg in ((h_lo, g_lo), (h_hi, g_hi))]
        prods = [np.array([_half_arith("mul", fmt, a, b) for a, b in zip(hh, gg)])
                 for hh, gg in ((h_lo, g_lo), (h_hi, g_hi))]
        fmas = [np.array([_half_arith("fma", fmt, a, b, c) for a, b, c in zip(hh, gg, ss)])
                for hh, gg, ss in ((h_lo, g_lo, sums[0]), (h_hi, g_hi, sums[1]))]
        for row, name, want in ((base + 2, "add", sums), (base + 3, "mul", prods),
                                (base + 4, "fma.rn", fmas)):
            got_lo, got_hi = _lanes(gp[row])
            report(f"{name}.{fmt}x2, both lanes (exact, one rounding)",
                   same_bits(np.concatenate([got_lo, got_hi]), np.concatenate(want), fmt))


@check
def mma(s, rng, report):
    """mma.sync m16n8k16, bf16 and f16 inputs, f32 accumulation, a warp a tile: against the
    exact sum (rational arithmetic) within 2^-20 of the sum of the terms' magnitudes, which the
    PTX ISA allows (it leaves the order and the precision of the accumulation to the hardware).
    A fragment read from the wrong lane or register is off by the size of a term. Then bit for
    bit against tensor_core_sum, the H200's rule, which the stand-in follows (on another GPU
    this row says whether its tensor cores sum the same way)."""
    tiles = 24
    for fmt, name in (("bf16", "mma_bf16"), ("f16", "mma_f16")):
        fn = s.function("mma", name)
        def sixteen(count):
            values = rng.standard_normal(count) * 2.0 ** rng.integers(-6, 6, count)
            bits = np.array([_half_round(float(v), fmt, "rn") for v in values], dtype=np.uint16)
            return bits, np.array([_half_value(int(b), fmt) for b in bits])
        a_bits, a = sixteen(tiles * 256)
        b_bits, b = sixteen(tiles * 128)
        c = rng.standard_normal(tiles * 128).astype(np.float32)
        dd = s.zeros(tiles * 128, np.float32)
        s.launch(fn, (tiles,), (32,), [s.to_device(a_bits), s.to_device(b_bits), s.to_device(c),
                                       dd, c_int(tiles)])
        got = s.from_device(dd, np.float32).reshape(tiles, 16, 8)
        a, b, c = a.reshape(tiles, 16, 16), b.reshape(tiles, 16, 8), c.reshape(tiles, 16, 8)
        exact = np.zeros((tiles, 16, 8))
        scale = np.zeros((tiles, 16, 8))
        for i in range(tiles):
            for row in range(16):
                for col in range(8):
                    terms = [Fraction(float(a[i, row, k])) * Fraction(float(b[i, k, col]))
                             for k in range(16)] + [Fraction(float(c[i, row, col]))]
                    exact[i, row, col] = float(sum(terms))
                    scale[i, row, col] = float(sum(abs(x) for x in terms))
        report(f"mma.sync.m16n8k16.row.col.f32.{fmt}.{fmt}.f32, {tiles} tiles "
               f"(within 2^-20 of the terms' magnitudes)",
               compare_abs(got, exact, 2.0 ** -20 * scale))
        report(f"mma.sync.m16n8k16.row.col.f32.{fmt}.{fmt}.f32, {tiles} tiles "
               f"(bit for bit the H200's tensor cores)",
               compare_exact(got, tensor_core_sum(a, b, c)))


class Affine(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("shift", ctypes.c_float), ("count", c_int),
                ("bias", ctypes.c_double)]


def _collatz(v, limit):
    steps = 0
    while v > 1 and steps < limit:
        v = 3 * v + 1 if v & 1 else v >> 1
        v &= 0xFFFFFFFF
        steps += 1
    return steps


def _classify(v):
    case = v % 8
    if case == 0:
        r = v * 3
    elif case == 1:
        r = v ^ 0x5A5A
    elif case == 2:
        r = v - 1000
    elif case == 3:
        r = v << 2
    elif case == 4:
        r = ~v
    elif case == 5:
        r = int(v / 3) if abs(v) < 2**52 else None
    elif case == 6:
        r = v & 0xFF
    else:
        r = -v
    return r


@check
def control_flow(s, rng, report):
    """Non-inlined .func calls (a loop, a switch), an unrolled loop with a run-time count, a
    local array, a struct parameter: integers exact; the f32/f64 affine maps exact (explicitly
    rounded __fmul_rn/__fadd_rn/__dmul_rn, NumPy rounds each operation the same)."""
    fn = s.function("control", "control_flow")
    n = 3000
    v = rng.integers(0, 20000, n)
    f = rng.standard_normal(n).astype(np.float32)
    p = Affine(1.75, -0.3, 13, 0.1)
    dv, df = s.to_device(v.astype(np.int32)), s.to_device(f)
    dints, dfl, ddb = s.zeros(4 * n, np.int32), s.zeros(n, np.float32), s.zeros(n, np.float64)
    s.launch(fn, (5,), (160,), [dv, df, p, dints, dfl, ddb, c_int(n)])
    got = s.from_device(dints, np.int32).reshape(4, n)
    vl = [int(t) for t in v]
    want = [
        [_collatz(t % 1000 + 1, 500) for t in vl],
        [_classify(t - 5000) for t in vl],
        [sum((t ^ j) * (j + 1) for j in range(13)) for t in vl],
        [t * (t % 16) + ((t % 16) ^ 5) for t in vl],
    ]
    names = ["__noinline__ collatz_steps (loop in a .func)", "__noinline__ classify (switch)",
             "#pragma unroll 4, run-time count from a struct parameter",
             "dynamically indexed local array"]
    for k, name in enumerate(names):
        report(f"{name} (exact)", compare_exact(got[k].astype(np.uint32), u32(want[k])))
    report("f * p.scale + p.shift in f32, two roundings (exact)",
           compare_exact(s.from_device(dfl, np.float32),
                         f * np.float32(1.75) + np.float32(-0.3)))
    report("(double)f * p.bias (exact)",
           compare_exact(s.from_device(ddb, np.float64), f.astype(np.float64) * 0.1))

    ids = s.function("control", "thread_ids")
    grid, block = (3, 2, 2), (4, 3, 2)
    total = 3 * 2 * 2 * 4 * 3 * 2
    dout, ddims = s.zeros(total, np.uint32), s.zeros(6, np.uint32)
    s.launch(ids, grid, block, [dout, ddims])
    want = np.zeros(total, dtype=np.uint32)
    for bz in range(2):
        for by in range(2):
            for bx in range(3):
                for tz in range(2):
                    for ty in range(3):
                        for tx in range(4):
                            blk = (bz * 2 + by) * 3 + bx
                            thr = (tz * 3 + ty) * 4 + tx
                            want[blk * 24 + thr] = (bx | by << 4 | bz << 8 | tx << 12 | ty << 16
                                                    | tz << 20)
    report("3-D grid (3,2,2) x block (4,3,2): blockIdx/threadIdx (exact)",
           compare_exact(s.from_device(dout, np.uint32), want))
    report("gridDim and blockDim (exact)",
           compare_exact(s.from_device(ddims, np.uint32), np.array(grid + block, dtype=np.uint32)))


# ---------------------------------------------------------------------------------------------
# Strict checks: error codes the real driver defines. The illegal address runs last: it
# poisons the context.


def _expect_code(cu, got, wanted):
    if got in wanted:
        return None
    return f"got {cu.describe(got)}, want {' or '.join(cu.describe(w) for w in wanted)}"


@strict
def launch_1025_threads(s, rng, report):
    """A block of 1025 threads (the limit is 1024) -> CUDA_ERROR_INVALID_VALUE, and the
    context stays usable."""
    fn = s.function("vector_add", "vector_add")
    n = 2048
    a = np.arange(n, dtype=np.float32)
    da, db, dc = s.to_device(a), s.to_device(a), s.zeros(n, np.float32)
    for block in ((1025, 1, 1), (32, 33, 1), (1, 1, 65)):
        code = s.launch_raw(fn, (1,), block, [da, db, dc, c_int(n)])
        report(f"block {block} -> CUDA_ERROR_INVALID_VALUE",
               _expect_code(s.cu, code, [CUDA_ERROR_INVALID_VALUE]))
    s.launch(fn, (2,), (1024,), [da, db, dc, c_int(n)])
    report("then a 1024-thread launch works", compare_exact(s.from_device(dc, np.float32), a + a))


@strict
def missing_function(s, rng, report):
    """cuModuleGetFunction of a name the module lacks -> CUDA_ERROR_NOT_FOUND."""
    fn = c_void_p()
    code = s.cu.raw("cuModuleGetFunction", ctypes.byref(fn), s.module("vector_add"),
                    b"no_such_kernel")
    report("cuModuleGetFunction(\"no_such_kernel\") -> CUDA_ERROR_NOT_FOUND",
           _expect_code(s.cu, code, [CUDA_ERROR_NOT_FOUND]))


@strict
def ptx_version_99(s, rng, report):
    """PTX that declares .version 99.0 -> CUDA_ERROR_UNSUPPORTED_PTX_VERSION."""
    with open(os.path.join(HERE, "vector_add.ptx"), "rb") as f:
        text = f.read()
    lines = text.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b".version"):
            lines[i] = b".version 99.0"
    image = ctypes.create_string_buffer(b"\n".join(lines) + b"\0")
    module = c_void_p()
    code = s.cu.raw("cuModuleLoadData", ctypes.byref(module), ctypes.cast(image, c_void_p))
    report(".version 99.0 -> CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
           _expect_code(s.cu, code, [CUDA_ERROR_UNSUPPORTED_PTX_VERSION]))
    if code == CUDA_SUCCESS:
        s.cu.raw("cuModuleUnload", module)


@strict
def double_free(s, rng, report):
    """cuMemFree_v2 of the same pointer twice: the second -> CUDA_ERROR_INVALID_VALUE."""
    ptr = c_u64()
    s.cu("cuMemAlloc_v2", ctypes.byref(ptr), 4096)
    first = s.cu.raw("cuMemFree_v2", ptr.value)
    report("first cuMemFree_v2 -> CUDA_SUCCESS", _expect_code(s.cu, first, [CUDA_SUCCESS]))
    second = s.cu.raw("cuMemFree_v2", ptr.value)
    report("second cuMemFree_v2 -> CUDA_ERROR_INVALID_VALUE",
           _expect_code(s.cu, second, [CUDA_ERROR_INVALID_VALUE]))


@strict
def illegal_address(s, rng, report):
    """A store 1 GiB past the end of a 256-byte allocation -> CUDA_ERROR_ILLEGAL_ADDRESS from
    the launch or the next cuCtxSynchronize, then from every later call in the context
    (sticky). Runs last, in a fresh process by default.

    On an H200 with driver 580.159 (a fresh process, this allocation alone): a store 0x200000
    to 0x4000000 bytes past is not caught at all (the driver maps memory in large pages around
    the allocation); 0x10000000, 0x40000000 (the default), 0x1000000000 and 0x10000000000
    give CUDA_ERROR_ILLEGAL_ADDRESS; 0x100000000 gives CUDA_ERROR_INVALID_ADDRESS_SPACE (717,
    a reserved window), as did 0x40000000 when the process had made other allocations first.
    Both errors are sticky."""
    fn = s.function("strict", "write_at")
    buf = s.alloc(256)
    offset = ILLEGAL_OFFSET_BYTES // 4  # in floats
    launch = s.launch_raw(fn, (1,), (1,), [buf, ctypes.c_longlong(offset), ctypes.c_float(1.0)])
    sync = s.cu.raw("cuCtxSynchronize") if launch == CUDA_SUCCESS else launch
    why = _expect_code(s.cu, sync, [CUDA_ERROR_ILLEGAL_ADDRESS])
    if sync == CUDA_ERROR_INVALID_ADDRESS_SPACE:
        why += " (the address fell in a reserved window: try another --illegal-offset)"
    report(f"store {ILLEGAL_OFFSET_BYTES:#x} bytes past a 256-byte allocation -> "
           f"CUDA_ERROR_ILLEGAL_ADDRESS (launch: {s.cu.describe(launch)})", why)
    ptr = c_u64()
    code = s.cu.raw("cuMemAlloc_v2", ctypes.byref(ptr), 256)
    report("then cuMemAlloc_v2 -> CUDA_ERROR_ILLEGAL_ADDRESS (sticky)",
           _expect_code(s.cu, code, [CUDA_ERROR_ILLEGAL_ADDRESS]))
    code = s.cu.raw("cuCtxSynchronize")
    report("then cuCtxSynchronize -> CUDA_ERROR_ILLEGAL_ADDRESS (sticky)",
           _expect_code(s.cu, code, [CUDA_ERROR_ILLEGAL_ADDRESS]))


# ---------------------------------------------------------------------------------------------


def _run_child(args):
    """Runs the illegal-address check in a fresh process; relays its lines, counts them."""
    import subprocess

    command = [sys.executable, os.path.abspath(__file__), "--libcuda", args.libcuda,
               "--strict-only", "--only", "illegal_address", "--in-process",
               f"--illegal-offset={ILLEGAL_OFFSET_BYTES}"]
    child = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)
    ok = bad = 0
    for line in child.stdout.splitlines():
        if line.startswith("ok "):
            ok += 1
        elif line.startswith("FAIL"):
            bad += 1
        if not line.startswith("#"):
            print(line)
    if child.returncode != 0 and bad == 0:
        bad += 1
        print(f"FAIL illegal_address: the child process exited with status {child.returncode}")
    sys.stdout.flush()
    return ok, bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="See the module docstring (head of check.py).")
    parser.add_argument("--libcuda", default="libcuda.so.1",
                        help="the driver library (default: libcuda.so.1 from the loader path)")
    parser.add_argument("--strict", action="store_true", help="also run the error checks")
    parser.add_argument("--strict-only", action="store_true", help="run only the error checks")
    parser.add_argument("--only", default=None, help="run the checks whose name contains this")
    parser.add_argument("--list", action="store_true", help="print the check names and exit")
    parser.add_argument("--illegal-offset", type=lambda v: int(v, 0), default=None,
                        help="bytes past the allocation the illegal-address check stores to "
                        "(default 0x40000000, 1 GiB)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the illegal-address check in this process (by default it "
                        "runs in a fresh child process, so that the context it poisons and "
                        "the device addresses it sees are its own)")
    args = parser.parse_args()
    if args.illegal_offset is not None:
        global ILLEGAL_OFFSET_BYTES
        ILLEGAL_OFFSET_BYTES = args.illegal_offset

    selected = [] if args.strict_only else list(CHECKS)
    if args.strict or args.strict_only:
        selected += STRICT
    if args.only:
        selected = [c for c in selected if args.only in c.__name__]
    if args.list:
        for c in CHECKS + STRICT:
            print(("strict " if c in STRICT else "       ") + c.__name__)
        return 0

    try:
        cu = Driver(args.libcuda)
    except OSError as e:
        print(f"FAIL load {args.libcuda}: {e}")
        return 2
    try:
        cu("cuInit", 0)
        dev = c_int()
        cu("cuDeviceGet", ctypes.byref(dev), 0)
        ctx = c_void_p()
        cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        cu("cuCtxSetCurrent", ctx)
    except CudaError as e:
        print(f"FAIL setup: {e}")
        return 2
    name = ctypes.create_string_buffer(256)
    version = c_int()
    desc = []
    if cu.has("cuDeviceGetName") and cu.raw("cuDeviceGetName", name, 256, dev) == 0:
        desc.append(name.value.decode(errors="replace"))
    if cu.has("cuDriverGetVersion") and cu.raw("cuDriverGetVersion", ctypes.byref(version)) == 0:
        desc.append(f"driver API {version.value // 1000}.{version.value % 1000 // 10}")
    print(f"# {args.libcuda} ({', '.join(desc) or 'no device name'})")

    session = Session(cu)
    failures = 0
    passes = 0
    for index, chk in enumerate(selected):
        if chk is illegal_address and not args.in_process:
            ok, bad = _run_child(args)
            passes += ok
            failures += bad
            continue
        # Seeded by the check's name: the same inputs whichever checks run.
        rng = np.random.default_rng([SEED, zlib.crc32(chk.__name__.encode())])
        start = time.perf_counter()
        lines = []

        def report(what, why, _lines=lines):
            _lines.append((what, why))

        try:
            chk(session, rng, report)
            error = None
        except CudaError as e:
            error = str(e)
        except Exception as e:  # a bug in the check or a malformed result
            error = f"{type(e).__name__}: {e}"
        elapsed = time.perf_counter() - start
        if chk is not illegal_address:
            session.free_all()
        for what, why in lines:
            if why is None:
                passes += 1
                print(f"ok   {chk.__name__}: {what}  [{elapsed:.2f}s]")
            else:
                failures += 1
                print(f"FAIL {chk.__name__}: {what}: {why}")
        if error is not None:
            failures += 1
            print(f"FAIL {chk.__name__}: {error}")
        sys.stdout.flush()
    print(f"# {passes} ok, {failures} failed")
    if not (args.strict or args.strict_only) or illegal_address not in selected:
        for mod in session.modules.values():
            cu.raw("cuModuleUnload", mod)
        for release in ("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"):
            if cu.has(release):
                cu.raw(release, dev)
                break
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
