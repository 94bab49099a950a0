"""The fused Triton kernel (quest_core.fused) against an independent float64 reference written here in plain torch,
forward and gradients (q, k, v and gains): in Triton's interpreter on CPU tensors, and compiled on a GPU.

The interpreter is switched on per test (``TRITON_INTERPRET=1`` through monkeypatch); quest_core.fused loads its
kernels once per mode, so the variable never leaks into other tests (or torch.compile's own Triton kernels).
"""

import math

import pytest
import torch

pytest.importorskip("triton")
# The interpreter converts 1-element arrays to Python scalars, which NumPy >= 1.25 deprecates (triton 3.6).
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

from quest_core.fused import fused_arguments, fused_attention, fused_supported, key_padding_from_mask  # noqa: E402

EPS = 1e-6  # quest_core's norm clamp: x / max(‖x‖, eps)
# Max error relative to the largest |value| of each compared tensor: the dtype's rounding over a short reduction.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def rand(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def reference(q, k, v, *, q_gain=None, k_gain=None, normalize_q=False, normalize_k=True, scale=1.0, is_causal=False,
              key_padding_mask=None):
    """softmax(scale · q̂ k̂ᵀ + mask) v in float64 from the formulas: x̂ = g ⊙ x / max(‖x‖, eps); grouped-query
    heads repeated; a query row with no key to attend gives 0."""

    def side(x, normalize, gain):
        if normalize:
            x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(EPS)
        return x if gain is None else x * gain.double()

    q_hat, k_hat = side(q.double(), normalize_q, q_gain), side(k.double(), normalize_k, k_gain)
    group = q.shape[-3] // k.shape[-3]
    k_hat, v = k_hat.repeat_interleave(group, dim=-3), v.double().repeat_interleave(group, dim=-3)
    logits = scale * q_hat @ k_hat.transpose(-1, -2)
    lq, lk = logits.shape[-2:]
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if is_causal:
        keep = keep & (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None])
    if key_padding_mask is not None:
        keep = keep & key_padding_mask[..., None, None, :]
    any_key = keep.any(-1, keepdim=True)
    logits = logits.masked_fill(~keep, -math.inf).masked_fill(~any_key, 0.0)  # no NaN in empty rows' backward
    probs = torch.softmax(logits, dim=-1) * any_key
    return probs @ v


def compare(q, k, v, dtype=torch.float32, device="cpu", gains=(), tolerance=None, **options):
    """Run fused_attention in ``dtype`` on ``device`` and the float64 CPU reference on the same (rounded) values;
    assert that the output and the gradients of q, k, v and every gain named in ``gains`` agree within
    ``tolerance`` (default TOLERANCE[dtype]), relative to each tensor's largest |value|."""
    tolerance = tolerance or TOLERANCE[dtype]
    grad_out = rand(*q.shape[:-1], v.shape[-1], seed=99).to(dtype)
    inputs = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    fused_options = {
        name: value.to(device, dtype).requires_grad_() if name in gains
        else value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in options.items()
    }
    out = fused_attention(*inputs, **fused_options)
    out.backward(grad_out.to(device))

    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in inputs]
    ref_options = {
        name: value.detach().cpu().double().requires_grad_() if name in gains
        else value.cpu() if isinstance(value, torch.Tensor) else value
        for name, value in fused_options.items()
    }
    expected = reference(*ref_inputs, **ref_options)
    expected.backward(grad_out.double())

    got = {"output": out, "dq": inputs[0].grad, "dk": inputs[1].grad, "dv": inputs[2].grad}
    want = {"output": expected, "dq": ref_inputs[0].grad, "dk": ref_inputs[1].grad, "dv": ref_inputs[2].grad}
    for name in gains:
        got[f"d{name}"], want[f"d{name}"] = fused_options[name].grad, ref_options[name].grad
    assert out.dtype == dtype and out.shape == expected.shape
    for name, w in want.items():
        g = got[name]
        assert g is not None and g.shape == w.shape, f"{name}: missing or wrong shape"
        scale = w.abs().max().item() or 1.0
        err = (g.detach().cpu().double() - w).abs().max().item() / scale
        assert err < tolerance, f"{name}: max error {err:.2e} relative to {scale:.3g} > {tolerance:.0e}"
    return out.detach().cpu()


def qkv(b=1, h=2, lq=37, lk=37, d=32, hkv=None, dv=None):
    hkv = hkv or h
    return rand(b, h, lq, d, seed=1), rand(b, hkv, lk, d, seed=2), rand(b, hkv, lk, dv or d, seed=3)


def variant_options(variant, h, d, seed=7):
    """fused_attention's options for a variant, with gains drawn around their usual size (so their gradients are
    exercised away from the initial value)."""
    shapes = {"qknorm": {"q_gain": (1,)}, "qknorm-hs": {"q_gain": (h, 1, 1)},
              "qknorm-ds": {"q_gain": (d,), "k_gain": (d,)}, "cosine": {"logit_scale": (h, 1, 1)}}.get(variant, {})
    params = {name: 1.0 + 0.3 * rand(*shape, seed=seed + i).abs() for i, (name, shape) in enumerate(shapes.items())}
    return fused_arguments(variant, d, params)


@pytest.mark.usefixtures("interpret")
class TestInterpreter:
    @pytest.mark.parametrize("d", [32, 24])
    @pytest.mark.parametrize("variant", ["quest", "qnorm", "qknorm", "qknorm-hs"])
    def test_variants_match_reference(self, variant, d):
        q, k, v = qkv(d=d)
        options = variant_options(variant, q.shape[1], d)
        gains = [name for name in ("q_gain", "k_gain") if options[name] is not None]
        compare(q, k, v, gains=gains, **options)

    @pytest.mark.slow
    @pytest.mark.parametrize("d", [64, 48])
    @pytest.mark.parametrize("variant", ["quest", "qknorm-hs", "qknorm-ds"])
    def test_wider_heads_match_reference(self, variant, d):
        q, k, v = qkv(lq=33, lk=40, d=d)
        options = variant_options(variant, q.shape[1], d)
        gains = [name for name in ("q_gain", "k_gain") if options[name] is not None]
        compare(q, k, v, gains=gains, **options)

    def test_cosine_gain_function_gets_gradients(self):
        """fused_arguments applies cosine's clamped exponential in torch: the raw parameter gets its gradient."""
        q, k, v = qkv(b=1, lq=20, lk=20)
        log_scale = torch.full((2, 1, 1), math.log(10.0), requires_grad=True)
        arguments = fused_arguments("cosine", 32, {"logit_scale": log_scale})
        out = fused_attention(q.float(), k.float(), v.float(), **arguments)
        out.sum().backward()
        ref_log_scale = log_scale.detach().double().requires_grad_()
        expected = reference(q, k, v, q_gain=ref_log_scale.exp(), normalize_q=True)
        expected.sum().backward()
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(log_scale.grad.double(), ref_log_scale.grad, rtol=1e-3, atol=1e-5)

    @pytest.mark.parametrize("lq,lk", [(37, 37), (20, 37), (37, 20)])
    def test_causal_is_top_left_aligned(self, lq, lk):
        q, k, v = qkv(lq=lq, lk=lk)
        compare(q, k, v, is_causal=True)

    def test_key_padding_and_rows_without_keys(self):
        """Padded keys get no weight; a batch element with every key padded gives 0 output and 0 gradients."""
        q, k, v = qkv(b=2, lq=21, lk=37)
        mask = torch.arange(37)[None, :] < torch.tensor([30, 0])[:, None]
        out = compare(q, k, v, key_padding_mask=mask)
        assert torch.all(out[1] == 0)

    def test_causal_with_key_padding(self):
        """The first keys padded: the causal rows that only saw them attend nothing (0), the others as usual."""
        q, k, v = qkv(b=2, lq=37, lk=37, hkv=1, h=2)
        mask = torch.ones(2, 37, dtype=torch.bool)
        mask[:, :5] = False
        out = compare(q, k, v, is_causal=True, key_padding_mask=mask)
        assert torch.all(out[:, :, :5] == 0) and torch.all(out[:, :, 5:].abs().sum(-1) > 0)

    def test_grouped_query_attention(self):
        q, k, v = qkv(h=4, hkv=2)
        compare(q, k, v, gains=["q_gain"], **variant_options("qknorm-hs", 4, 32))

    def test_value_head_dim_and_leading_dims(self):
        """Dv ≠ D, no batch dim (H, L, D), and a non-contiguous query (a transposed (L, H, D) buffer)."""
        q, k, v = qkv(b=1, d=32, dv=48)
        q = q[0].transpose(0, 1).contiguous().transpose(0, 1)
        assert not q.is_contiguous()
        compare(q, k[0], v[0])

    def test_zero_key_uses_the_clamped_norm(self):
        """An all-zero key normalises to 0 (not NaN), with the clamp's gradient 1/eps, as quest_core's."""
        q, k, v = qkv(b=1, lq=16, lk=16)
        k[0, 0, 3] = 0.0
        compare(q, k, v)

    def test_float16(self):
        q, k, v = qkv(lq=33, lk=33)
        compare(q, k, v, dtype=torch.float16, is_causal=True, gains=["q_gain"], **variant_options("qknorm", 2, 32))

    def test_bfloat16_is_refused_in_the_interpreter(self):
        """Triton 3.6's interpreter stores bfloat16 as raw uint16 bits and its dot product multiplies those: the
        kernel refuses bfloat16 there (CUDA tests cover it) instead of returning garbage."""
        q, k, v = (t.bfloat16() for t in qkv())
        ok, reason = fused_supported(q, k, v)
        assert not ok and "bfloat16" in reason

    def test_under_torch_compile_it_is_a_graph_break(self):
        """torch.compile runs the surrounding code compiled and the fused call eagerly, gradients included."""
        q, k, v = (t.float().requires_grad_() for t in qkv(lq=20, lk=20))
        compiled = torch.compile(lambda q, k, v: 2.0 * fused_attention(q, k, v), backend="eager", fullgraph=False)
        out = compiled(q, k, v)
        out.sum().backward()
        ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
        expected = 2.0 * reference(*ref_inputs)
        expected.sum().backward()
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
        for got, want in zip((q, k, v), ref_inputs):
            torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-5)

    def test_saves_only_raw_inputs_output_and_row_statistics(self):
        """Autograd keeps q, k, v, the output and one float32 per query row: no normalised copy of q or k."""
        q, k, v = (t.float().requires_grad_() for t in qkv(lq=37, lk=29))
        saved = {}

        def pack(t):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fused_attention(q, k, v, normalize_q=True)
        rows = q.shape[0] * q.shape[1] * q.shape[2]
        expected = sum(t.numel() * t.element_size() for t in (q, k, v, out)) + rows * 4
        assert sum(saved.values()) == expected

    def test_gradcheck_small_float32_problem_matches_finite_differences(self):
        """Beyond the reference: the fused gradients of a tiny float32 problem match central differences."""
        q, k, v = (t.float() for t in qkv(b=1, h=1, lq=5, lk=6, d=16))
        gain = torch.tensor([2.0])
        fn = lambda q, k, v, g: fused_attention(q, k, v, q_gain=g, normalize_q=True).double()  # noqa: E731
        inputs = [t.clone().requires_grad_() for t in (q, k, v, gain)]
        out = fn(*inputs)
        grads = torch.autograd.grad(out.sum(), inputs)
        step = 1e-2
        for index, (x, grad) in enumerate(zip(inputs, grads)):
            flat = x.detach().flatten()
            position = int(flat.abs().argmax())
            shifted = []
            for sign in (1, -1):
                values = [t.detach().clone() for t in inputs]
                values[index].view(-1)[position] += sign * step
                shifted.append(fn(*values).sum().item())
            numeric = (shifted[0] - shifted[1]) / (2 * step)
            assert grad.view(-1)[position].item() == pytest.approx(numeric, rel=2e-2, abs=2e-3)


class TestSupport:
    def test_cpu_tensors_need_the_interpreter(self, monkeypatch):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        q, k, v = (t.float() for t in qkv())
        ok, reason = fused_supported(q, k, v)
        assert not ok and "CUDA" in reason and "TRITON_INTERPRET" in reason
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            fused_attention(q, k, v)

    @pytest.mark.usefixtures("interpret")
    @pytest.mark.parametrize("case,needle", [
        ("float64", "float16, bfloat16 or float32"),
        ("head_dim_8", "16 to 128"),
        ("head_dim_160", "16 to 128"),
        ("dropout", "no dropout"),
        ("float_mask", "general attn_mask"),
        ("bad_gain", "must broadcast to (heads, 1, head_dim)"),
        ("bad_padding", "does not broadcast"),
        ("heads", "multiple of key/value heads"),
        ("layernorm_variant", "not fused"),
        ("empty", "empty inputs"),
        ("batch_heads", "at most 65535"),
    ])
    def test_unsupported_calls_say_why(self, case, needle):
        q, k, v = (t.float() for t in qkv(h=4, d=32))
        kwargs = {}
        if case == "float64":
            q, k, v = q.double(), k.double(), v.double()
        elif case.startswith("head_dim"):
            d = int(case.rsplit("_", 1)[1])
            q, k, v = (t.float() for t in qkv(d=d))
        elif case == "dropout":
            kwargs["dropout_p"] = 0.1
        elif case == "float_mask":
            kwargs["attn_mask"] = torch.zeros(37, 37)
        elif case == "bad_gain":
            kwargs["q_gain"] = torch.ones(3)
        elif case == "bad_padding":
            kwargs["key_padding_mask"] = torch.ones(2, 36, dtype=torch.bool)
        elif case == "heads":
            k, v = k[:, :3], v[:, :3]
        elif case == "layernorm_variant":
            kwargs["variant"] = "qk-layernorm"
        elif case == "empty":
            q = q[:, :, :0]
        elif case == "batch_heads":  # expanded views: no memory behind the large batch
            q, k, v = (t.expand(16384, 4, 37, 32) for t in (q, k, v))
        ok, reason = fused_supported(q, k, v, **kwargs)
        assert not ok and needle in reason, reason

    @pytest.mark.usefixtures("interpret")
    def test_supported_call(self):
        q, k, v = (t.float() for t in qkv(h=4, hkv=2, d=48))
        assert fused_supported(q, k, v, is_causal=True, q_gain=torch.ones(4, 1, 1), variant="qknorm-hs") == (True, "")

    def test_fused_arguments_map_variants(self):
        assert fused_arguments("quest", 64) == {"scale": 1.0, "normalize_q": False, "q_gain": None,
                                               "normalize_k": True, "k_gain": None}
        gain = torch.tensor([3.0])
        qknorm = fused_arguments("qknorm", 64, {"q_gain": gain})
        assert qknorm["normalize_q"] and qknorm["normalize_k"] and qknorm["q_gain"] is gain
        assert fused_arguments("qknorm-ds", 64)["scale"] == pytest.approx(8.0)
        with pytest.raises(ValueError, match="elliptical metric"):
            fused_arguments("elliptical-quest", 64)
        with pytest.raises(ValueError, match="needs parameter 'q_gain'"):
            fused_arguments("qknorm", 64, {"other": gain})

    def test_key_padding_from_mask(self):
        q, k, _ = qkv(b=3, lq=5, lk=7)
        keep = torch.rand(3, 7) > 0.5
        assert torch.equal(key_padding_from_mask(keep[:, None, None, :], q, k), keep)
        assert key_padding_from_mask(keep[:, None, None, :].expand(3, 1, 5, 7), q, k) is None  # varies over rows
        assert key_padding_from_mask(keep[:, None, None, :].float(), q, k) is None  # a float mask
        assert key_padding_from_mask(None, q, k) is None


def compile_kernels(dtype, head_dim, arch, names=("fwd", "dkdv", "dq")):
    """Compile the kernels (interpreter off) for an NVIDIA architecture without a GPU, with every feature switched
    on and the tile configuration fused_attention would launch; returns {name: shared memory bytes}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from quest_core import fused

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton build has no NVIDIA backend")
    kernels = fused._kernels(False)
    element = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    tiles = fused._tiles(head_dim, dtype, interpret=False)
    flags = dict(NORM_Q=True, NORM_K=True, Q_GAIN=True, K_GAIN=True, CAUSAL=True, HAS_KPM=True, BLOCK_D=head_dim,
                 BLOCK_DV=head_dim, PRECISION=fused._precision(dtype), K_GAIN_GRAD=True, Q_GAIN_GRAD=True)
    functions = {"fwd": kernels.fwd_kernel, "dkdv": kernels.bwd_dkdv_kernel, "dq": kernels.bwd_dq_kernel}
    shared = {}
    for name in names:
        fn = functions[name]
        block_m, block_n, warps, stages = tiles[name]
        constexprs = {k: v for k, v in {**flags, "BLOCK_M": block_m, "BLOCK_N": block_n}.items() if k in fn.arg_names}
        signature = {}
        for arg in fn.arg_names:
            if arg in constexprs:
                signature[arg] = "constexpr"
            elif arg in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV_"):
                signature[arg] = f"*{element}"
            elif arg == "KPM":
                signature[arg] = "*u8"
            elif arg in ("QG", "KG", "LSE", "DELTA", "DKG", "DQG"):
                signature[arg] = "*fp32"  # gain tables, LSE, delta, gain-gradient partials
            elif arg in ("qk_scale", "scale", "eps"):
                signature[arg] = "fp32"
            else:
                signature[arg] = "i32"
        source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": warps, "num_stages": stages})
        assert compiled.asm["cubin"], f"{name}: no machine code"
        shared[name] = compiled.metadata.shared
    return shared


class TestCompilesWithoutAGpu:
    """The compiled (not interpreted) kernels go through Triton's whole pipeline, ptxas included, for NVIDIA GPUs:
    the interpreter cannot catch what only the compiler checks (types, layouts, shared memory)."""

    @pytest.fixture(autouse=True)
    def fresh_cache(self, tmp_path, monkeypatch):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile for real, not from an earlier run's cache

    def test_hopper_bfloat16(self):
        shared = compile_kernels(torch.bfloat16, 64, arch=90)
        assert all(0 < size <= 100 * 1024 for size in shared.values()), shared

    @pytest.mark.slow
    @pytest.mark.parametrize("arch", [80, 90])
    @pytest.mark.parametrize("head_dim", [64, 128])
    @pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
    def test_every_tile_configuration(self, dtype, head_dim, arch):
        """Each tile configuration of fused._tiles fits in 100 KiB of shared memory (every NVIDIA GPU since Ampere
        has at least that per block)."""
        shared = compile_kernels(dtype, head_dim, arch)
        assert all(0 < size <= 100 * 1024 for size in shared.values()), shared


CUDA_TOLERANCE = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCompiledOnCuda:
    """The compiled kernels (interpreter off) on a GPU, at a size that spans several of their larger tiles."""

    @pytest.fixture(autouse=True)
    def compiled(self, monkeypatch):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def run(self, dtype, variant="quest", d=64, h=4, hkv=None, **options):
        q, k, v = qkv(b=2, h=h, hkv=hkv, lq=300, lk=300, d=d)
        arguments = variant_options(variant, h, d)
        gains = [name for name in ("q_gain", "k_gain") if arguments[name] is not None]
        compare(q, k, v, dtype=dtype, device="cuda", gains=gains, tolerance=CUDA_TOLERANCE[dtype],
                **arguments, **options)

    @pytest.mark.parametrize("dtype", list(CUDA_TOLERANCE), ids=str)
    @pytest.mark.parametrize("variant", ["quest", "qnorm", "qknorm", "qknorm-hs", "qknorm-ds"])
    def test_variants(self, variant, dtype):
        self.run(dtype, variant)

    @pytest.mark.parametrize("d", [32, 48, 128])
    def test_head_dims_causal(self, d):
        self.run(torch.bfloat16, d=d, is_causal=True)

    def test_key_padding_and_gqa(self):
        mask = (torch.arange(300)[None, :] < torch.tensor([300, 77])[:, None]).cuda()
        self.run(torch.float16, h=8, hkv=2, key_padding_mask=mask)


def load_gpu_benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "attention_gpu.py"
    spec = importlib.util.spec_from_file_location("attention_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")
def test_gpu_benchmark_exits_cleanly_without_a_gpu(tmp_path, capsys):
    """benchmarks/attention_gpu.py says there is no CUDA device, exits 0 and writes no report."""
    module = load_gpu_benchmark()
    out = tmp_path / "report.md"
    assert module.main(["--out", str(out)]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("interpret")
def test_gpu_benchmark_rows_on_a_cpu_stand_in(monkeypatch):
    """The benchmark's measurement and table code, run on CPU tensors (interpreter, float16) with the CUDA timing
    and memory calls replaced by stand-ins: every row runs, and the fused rows agree with their eager rows."""
    import time

    import triton.testing

    module = load_gpu_benchmark()
    monkeypatch.setattr(module, "DEVICE", "cpu")
    for name, value in (("synchronize", None), ("reset_peak_memory_stats", None), ("memory_allocated", 0),
                        ("max_memory_allocated", 2**20)):
        monkeypatch.setattr(torch.cuda, name, lambda value=value: value)

    def one_call_ms(fn, grad_to_none=None, return_mode="median"):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    monkeypatch.setattr(triton.testing, "do_bench", one_call_ms)
    results = module.measure(("stand-in", 1, 2, 40, 32, True), torch.float16, rounds=1)
    assert [entry["row"] for entry in results] == module.ROWS
    assert all("note" not in entry and entry["ms"] > 0 for entry in results), results
    assert [entry["time_ratio"] for entry in results][0] == 1.0
    assert all(entry["diff"] < 1e-2 for entry in results if entry["row"] in module.FUSED_OF)
    table = module.table(results)
    assert len(table) == 2 + len(module.ROWS) and "| stand-in (1,2,40,32, causal) | quest fused |" in table[5]
