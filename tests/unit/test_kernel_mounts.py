"""The one mountinfo reader: escaped fields decoded, optional fields kept, the cpu cgroup found (v1 first)."""

from __future__ import annotations

from chaos.kernel.mounts import CpuCgroup, MountInfo, cpu_cgroup, mountinfo, unescape

V2 = "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_CPU = "33 25 0:29 /docker/x /sys/fs/cgroup/cpu,cpuacct rw master:9 - cgroup cgroup rw,cpu,cpuacct\n"


def test_escaped_fields_are_decoded() -> None:
    assert unescape(r"/mnt/with\040space\011tab\134slash") == "/mnt/with space\ttab\\slash"
    assert unescape("/plain") == "/plain"


def test_a_line_is_read_into_its_fields_and_others_are_passed_over() -> None:
    text = r"36 25 8:1 /data /mnt/my\040disk rw,relatime shared:1 master:2 - ext4 /dev/sda1 rw,errors=remount-ro"
    assert mountinfo(text + "\nnot a mountinfo line\n") == [
        MountInfo("/data", "/mnt/my disk", ("shared:1", "master:2"), "ext4", ("rw", "errors=remount-ro"))
    ]


def test_the_v1_cpu_controller_wins_over_the_unified_hierarchy() -> None:
    assert cpu_cgroup(V2 + V1_CPU) == CpuCgroup(1, "/sys/fs/cgroup/cpu,cpuacct", "/docker/x")


def test_the_unified_hierarchy_counts_only_where_it_offers_cpu() -> None:
    assert cpu_cgroup(V2) == CpuCgroup(2, "/sys/fs/cgroup", "/")
    assert cpu_cgroup(V2, lambda path: "cpuset cpu io memory") == CpuCgroup(2, "/sys/fs/cgroup", "/")
    assert cpu_cgroup(V2, lambda path: "memory pids") is None
    assert cpu_cgroup("") is None


def test_a_process_cgroup_maps_to_its_directory_under_the_mount() -> None:
    v1 = CpuCgroup(1, "/sys/fs/cgroup/cpu,cpuacct", "/docker/x")
    proc_v1 = "12:memory:/docker/x/job\n4:cpu,cpuacct:/docker/x/job\n0::/docker/x/job\n"
    assert v1.directory_of(proc_v1) == "/sys/fs/cgroup/cpu,cpuacct/job"
    assert v1.directory_of("4:cpu,cpuacct:/elsewhere\n") is None
    v2 = CpuCgroup(2, "/sys/fs/cgroup", "/")
    assert v2.directory_of(proc_v1) == "/sys/fs/cgroup/docker/x/job"
    assert v2.directory_of("4:cpu,cpuacct:/docker/x/job\n") is None
