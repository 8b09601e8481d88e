"""The main job's precision choice: float32 unless the CPU has bf16 instructions AND bf16 is validated."""
from opencood_ext.training.precision import cpu_flags, job_precision


def test_no_bf16_instructions_means_float32(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n")
    assert cpu_flags(info) == {"fpu", "sse", "avx2", "fma"}
    p = job_precision(cpu_flags(info), validated="archive/x")
    assert p.choice == "float32" and not p.cpu_bf16 and "emulated" in p.reason


def test_bf16_needs_the_validation_too():
    flags = frozenset({"avx2", "avx512_bf16"})
    unvalidated = job_precision(flags, validated=None)
    assert unvalidated.choice == "float32" and unvalidated.cpu_bf16 and "not yet validated" in unvalidated.reason
    chosen = job_precision(flags, validated="archive/bf16_check")
    assert chosen.choice == "bf16" and "archive/bf16_check" in chosen.reason
    assert job_precision(frozenset({"amx_bf16"}), validated="a").choice == "bf16"


def test_missing_cpuinfo_is_no_flags(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
