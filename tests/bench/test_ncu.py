"""ncu's --csv output parsed into per-kernel metrics (both layouts), and its errors surfaced."""
from rich.console import Console

from strata.bench import ncu

# ncu 2024/2025 default layout, `--csv --print-units base`, the profiled program's lines around it.
LONG = '''==PROF== Connected to process 48213 (/usr/bin/python3.12)
==PROF== Profiling "k_rms_norm_reduce" - 0: 0%....50%....100% - 9 passes
==PROF== Profiling "k_add_exp" - 1: 0%....50%....100% - 9 passes
==PROF== Disconnected from process 48213
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","48213","python3.12","127.0.0.1","k_rms_norm_reduce","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","87.41"
"0","48213","python3.12","127.0.0.1","k_rms_norm_reduce","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,544"
"0","48213","python3.12","127.0.0.1","k_rms_norm_reduce","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","30"
"0","48213","python3.12","127.0.0.1","k_rms_norm_reduce","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","21.07"
"0","48213","python3.12","127.0.0.1","k_rms_norm_reduce","1","7","(256, 1, 1)","(2048, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","78.93"
"1","48213","python3.12","127.0.0.1","k_add_exp","1","7","(128, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","n/a"
"1","48213","python3.12","127.0.0.1","k_add_exp","1","7","(128, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1,203.52"
"1","48213","python3.12","127.0.0.1","k_add_exp","1","7","(128, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","16"
'''

RAW = '''==PROF== Connected to process 7
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","launch__registers_per_thread"
"","","","","","","","","","","","%","msecond","register/thread"
"0","7","python","h","k_softmax_reduce(float const*, float*)","1","7","(64, 1, 1)","(4, 1, 1)","0","8.0","3.12","0.00412","24"
'''


def test_parse_long_layout():
    ks = ncu.parse_ncu_csv(LONG)
    assert [k.name for k in ks] == ["k_rms_norm_reduce", "k_add_exp"]
    a, b = ks
    assert a.duration_us == 12.544 and a.value("dram") == 87.41 and a.value("occupancy") == 78.93
    assert a.value("registers") == 30 and a.value("sm") == 21.07
    assert (a.block, a.grid) == ("(256, 1, 1)", "(2048, 1, 1)")
    assert b.duration_us == 1203.52 and b.value("dram") is None and b.value("occupancy") is None


def test_parse_raw_layout():
    (k,) = ncu.parse_ncu_csv(RAW)
    assert k.base_name == "k_softmax_reduce"
    assert k.duration_us == 4.12 and k.value("dram") == 3.12 and k.value("registers") == 24


def test_no_csv_and_errors():
    text = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have " \
           "permission to access NVIDIA GPU Performance Counters on the target device 0.\n"
    assert ncu.parse_ncu_csv(text) == []
    assert ncu.ncu_errors(text)[0].startswith("ERR_NVGPUCTRPERM")
    assert ncu.number("1,234.5") == 1234.5 and ncu.number("n/a") is None


def test_command_profiles_only_strata_kernels():
    cmd = ncu.ncu_command("/usr/bin/ncu", "torch.relu(torch.randn(4))", ["k_a", "k_b.1"])
    i = cmd.index("--kernel-name")
    assert cmd[i + 1] == r"regex:^(k_a|k_b\.1)$" and cmd[cmd.index("--launch-count") + 1] == "2"
    assert cmd[-3:] == ["strata.bench.ncu", "--target", "torch.relu(torch.randn(4))"]
    assert "--csv" in cmd and ",".join(ncu.METRICS.values()) in cmd


def test_table_renders():
    console = Console(record=True, width=200)
    console.print(ncu.ncu_table(ncu.parse_ncu_csv(LONG)))
    text = console.export_text()
    assert "k_rms_norm_reduce" in text and "12.5" in text and "87.4" in text and "1203.5" in text
