"""TuneD profile conversion, pure: profiles held in memory, found by name like TuneD would."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stortune.schemas import tuned
from stortune.schemas.tuned import Found, TunedFileError, TunedImport, export_profile, import_profile


@dataclass
class MemorySource:
    """Profiles by name in one directory ("/lib"); counts lookups so a loop would show."""

    profiles: dict[str, str]
    asked: list[str] = field(default_factory=list)

    def find(self, name: str, skip_directory: str | None) -> Found | None:
        self.asked.append(name)
        if name not in self.profiles or skip_directory == "/lib":
            return None
        text = self.profiles[name]
        if len(text) > tuned.MAX_FILE_BYTES:
            raise TunedFileError(f"/lib/{name}/tuned.conf: larger than {tuned.MAX_FILE_BYTES} bytes")
        return Found(f"/lib/{name}/tuned.conf", "/lib", text)


def run(text: str, **others: str) -> TunedImport:
    source = MemorySource(dict(others))
    return import_profile(Found("/etc/mine/tuned.conf", "/etc", text), "mine", source)


def reasons(result: TunedImport) -> dict[str, str]:
    return {s.line: s.reason for s in result.skipped}


def settings(result: TunedImport) -> list[tuple[str, dict[str, object], dict[str, int | str]]]:
    return [(r.name, r.match.model_dump(mode="json", exclude_none=True), r.values()) for r in result.rules]


# Hostile input first ---------------------------------------------------------------------


def test_include_cycle_is_reported_and_each_file_read_once() -> None:
    source = MemorySource({
        "a": "[main]\ninclude=b\n[disk]\nreadahead=1024\n",
        "b": "[main]\ninclude=a\n[sysfs]\n/sys/block/sd*/queue/nr_requests=256\n",
    })
    result = import_profile(Found("/lib/a/tuned.conf", "/lib", source.profiles["a"]), "a", source)
    assert source.asked == ["b", "a"]
    cycle = [s for s in result.skipped if s.line == "include = a"]
    assert cycle and cycle[0].reason.startswith("include cycle: /lib/a/tuned.conf -> /lib/b/tuned.conf")
    # TuneD's order: the included profile's units first.
    assert settings(result) == [("sysfs-sd", {"name": ["sd*"]}, {"nr_requests": 256}),
                                ("disk", {"kind": ["disk"]}, {"read_ahead_kb": 1024})]


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "..", "a/../b", ".hidden", "x" * 200])
def test_include_never_leaves_the_profile_directories(name: str) -> None:
    source = MemorySource({})
    found = Found("/etc/mine/tuned.conf", "/etc", f"[main]\ninclude={name}\n")
    result = import_profile(found, "mine", source)
    assert source.asked == []  # refused before any lookup
    assert reasons(result) == {f"include = {name}"[:200]: "not a profile name (letters, digits, '.', '_',"
                               " '-'; no '/' or '..')"}


def test_an_oversized_include_is_skipped_and_the_rest_converted() -> None:
    huge = "[disk]\n" + "#" * tuned.MAX_FILE_BYTES
    result = run("[main]\ninclude=huge\n[disk]\nelevator=none\n", huge=huge)
    assert "larger than" in reasons(result)["include = huge"]
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"scheduler": "none"})]


def test_an_oversized_text_is_refused_by_the_parser_too() -> None:
    with pytest.raises(TunedFileError, match="larger than"):
        tuned.parse("x" * (tuned.MAX_FILE_BYTES + 1), "big")


def test_deep_include_chain_stops_at_the_bound() -> None:
    chain = {f"p{i}": f"[main]\ninclude=p{i + 1}\n[sysfs]\n/sys/block/d{i}/queue/nomerges=1\n"
             for i in range(30)}
    source = MemorySource(chain)
    result = import_profile(Found("/lib/p0/tuned.conf", "/lib", chain["p0"]), "p0", source)
    assert len(result.files) == tuned.MAX_INCLUDE_DEPTH
    assert reasons(result)[f"include = p{tuned.MAX_INCLUDE_DEPTH}"] == (
        f"includes nest deeper than {tuned.MAX_INCLUDE_DEPTH}")
    deepest_first = reversed(range(tuned.MAX_INCLUDE_DEPTH))
    assert [r.match.name for r in result.rules] == [[f"d{i}"] for i in deepest_first]


def test_many_includes_stop_at_the_file_bound() -> None:
    names = [f"q{i}" for i in range(40)]
    profiles = {n: "[main]\nsummary=x\n" for n in names}
    result = run(f"[main]\ninclude={','.join(names)}\n", **profiles)
    assert len(result.files) == tuned.MAX_FILES
    assert reasons(result)["include = q39"] == f"more than {tuned.MAX_FILES} files in one import"


@pytest.mark.parametrize(("devices", "why"), [
    ("!sda", "devices= excludes devices with '!'; a stortune match has no exclusion"),
    ("sd*, !sda", "devices= excludes devices with '!'; a stortune match has no exclusion"),
    ("s" * 600, "device glob 'sssss"),
    ("../sda", "device glob '../sda' is not a kernel device name"),
    ("${f:exec:ls}", "${f:exec:ls} is a TuneD function evaluated on the host"),
    ("${nowhere}", "${nowhere} is not defined in [variables]"),
])
def test_device_globs_stortune_cannot_express_drop_the_unit(devices: str, why: str) -> None:
    result = run(f"[disk]\ndevices={devices}\nreadahead=512\n")
    assert result.rules == []
    assert reasons(result)[f"devices = {devices}"[:200]].startswith(why)
    assert "devices=" in reasons(result)["readahead = 512"]  # the setting is listed too, with why


def test_device_globs_become_name_globs() -> None:
    result = run("[disk]\ndevices = sd*, nvme?n1;vdb\nreadahead=8192 s\n")
    assert settings(result) == [("disk", {"kind": ["disk"], "name": ["sd*", "nvme?n1", "vdb"]},
                                 {"read_ahead_kb": 4096})]


@pytest.mark.parametrize("key", [
    "/sys/block/../../etc/queue/read_ahead_kb",
    "/sys/block/sda/../../../etc/shadow",
    "/sys/kernel/mm/ksm/run",
    "/sys/block/sda/queue/rotational",
    "/sys/block/sda",
])
def test_sysfs_lines_outside_the_catalog_are_skipped(key: str) -> None:
    result = run(f"[sysfs]\n{key} = 1\n")
    assert result.rules == []
    assert f"{key} = 1" in reasons(result)


def _nested_variables(levels: int, uses: int) -> str:
    """[variables] where each level uses the one below ``uses`` times: uses**levels characters."""
    lines = ["[variables]", "v0=4096"]
    lines += [f"v{i}={f'${{v{i - 1}}}' * uses}" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\n[disk]\nreadahead=${{v{levels}}}\n"


def test_hostile_exponential_variables_are_refused_naming_the_variable() -> None:
    # Issue 26: a 2 KiB tuned.conf (seven levels, each used 60 times) ran past 90 s of CPU.
    text = _nested_variables(7, 60)
    assert len(text) < 2600
    result = run(text)
    assert result.rules == []
    assert reasons(result)["readahead = ${v7}"] == (
        f"${{v6}} expands the value to 18000 characters, more than {tuned.MAX_EXPANDED_CHARS}:"
        " define the value without repeating variables")


@pytest.mark.parametrize(("extra", "expanded"), [(0, True), (1, False)])
def test_hostile_expansion_at_the_bound_passes_and_one_past_is_refused(extra: int, expanded: bool) -> None:
    size = tuned.MAX_EXPANDED_CHARS + extra
    result = run(f"[variables]\nhalf={'x' * (size // 2)}\nall=${{half}}${{half}}{'x' * (size % 2)}\n"
                 "[disk]\nreadahead=${all}\n")
    why = reasons(result)["readahead = ${all}"]
    if expanded:  # substituted whole: what is refused is the value itself, not its size
        assert why.startswith("readahead is not '[>]N'"), why
    else:
        assert why.startswith(f"${{half}} expands the value to {size} characters, more than "
                              f"{tuned.MAX_EXPANDED_CHARS}"), why


def test_variables_resolve_without_evaluating_anything() -> None:
    result = run("[variables]\nra=2048\nboth=${ra}\nloop=${loop}\nhost=${f:exec:/bin/false}\n"
                 "include=/etc/tuned/x-variables.conf\n"
                 "[disk]\nreadahead=>${both}\n[sysfs]\n/sys/block/sd*/queue/nr_requests=${loop}\n"
                 "/sys/block/vd*/queue/nr_requests=${host}\n")
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"read_ahead_kb": 2048})]
    why = reasons(result)
    assert why["/sys/block/sd*/queue/nr_requests = ${loop}"] == "variables nest deeper than 8"
    assert why["/sys/block/vd*/queue/nr_requests = ${host}"].endswith("TuneD function evaluated on the host")
    assert why["include = /etc/tuned/x-variables.conf"].startswith("variable files are not read")
    assert result.notes == ["/etc/mine/tuned.conf:8: readahead '>' (only raise) became read_ahead_kb = 2048:"
                            " stortune sets the value, so a device already above it is lowered"]


@pytest.mark.parametrize(("value", "why"), [
    ("4097", "read_ahead_kb must be a multiple of 4"),
    ("3 s", "3 sectors is not a whole KiB"),
    ("9999999999", "read_ahead_kb must be <= 1048576"),
    ("lots", "readahead is not '[>]N' (KiB) or '[>]N s' (sectors)"),
    ("-8", "readahead is not"),
])
def test_readahead_values_that_do_not_convert(value: str, why: str) -> None:
    result = run(f"[disk]\nreadahead={value}\n")
    assert result.rules == []
    assert reasons(result)[f"readahead = {value}"].startswith(why)


def test_elevators() -> None:
    result = run("[disk]\nelevator=deadline\n[d2]\ntype=disk\ndevices=vd*\nelevator=cfq\n"
                 "[d3]\ntype=disk\nelevator=bfq,none\n")
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"scheduler": "mq-deadline"})]
    assert reasons(result)["elevator = cfq"].startswith("cfq was removed from Linux")
    assert reasons(result)["elevator = bfq,none"].startswith("a list of elevators")
    assert result.notes == ["/etc/mine/tuned.conf:2: elevator deadline is mq-deadline on multi-queue kernels"]


def test_only_sysctl_lines_give_no_rules_and_every_line_skipped() -> None:
    result = run("[main]\nsummary=memory only\n[sysctl]\nvm.swappiness=10\nkernel.pid_max = 65536\n"
                 "[vm]\ntransparent_hugepages=never\n[cpu]\ngovernor=performance\n")
    assert result.rules == [] and result.profile() is None
    sysctl = "kernel parameter (sysctl) outside stortune's catalog"
    assert [(s.where, s.line, s.reason) for s in result.skipped] == [
        ("/etc/mine/tuned.conf:4", "vm.swappiness = 10", sysctl),
        ("/etc/mine/tuned.conf:5", "kernel.pid_max = 65536", sysctl),
        ("/etc/mine/tuned.conf:7", "transparent_hugepages = never",
         "memory management (vm plugin) is not stortune's job"),
        ("/etc/mine/tuned.conf:9", "governor = performance", "CPU tuning (cpu plugin) is not stortune's job"),
    ]


def test_malformed_lines_conditional_and_disabled_units() -> None:
    result = run("stray = 1\n[disk]\njust words\nreadahead=256\ndynamic=1\napm=128\n"
                 "[arm]\ntype=disk\nuname_regex=aarch64\nreadahead=999999\n"
                 "[off]\ntype=sysfs\nenabled=false\n/sys/block/sda/queue/nomerges=2\n")
    why = reasons(result)
    assert why["stray = 1"] == "outside any [section]"
    assert why["just words"] == "not a 'key = value' line"
    assert why["dynamic = 1"].startswith("dynamic tuning is not stortune's job")
    assert why["apm = 128"] == "the disk plugin's 'apm' has no stortune tunable"
    assert why["readahead = 999999"].startswith("the unit applies only where uname_regex matches")
    assert why["/sys/block/sda/queue/nomerges = 2"] == "unit [off] is disabled"
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"read_ahead_kb": 256})]


def test_includer_overrides_and_replace_drops_included_options() -> None:
    base = "[disk]\nreadahead=1024\nelevator=none\n[sysfs]\n/sys/block/sd*/queue/nomerges=1\n"
    result = run("[main]\ninclude=base\n[disk]\nreadahead=2048\n[sysfs]\nreplace=1\n"
                 "/sys/block/vd*/queue/rq_affinity=2\n", base=base)
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"read_ahead_kb": 2048, "scheduler": "none"}),
                                ("sysfs-vd", {"name": ["vd*"]}, {"rq_affinity": 2})]


def test_same_name_include_extends_the_profile_further_down_the_search() -> None:
    source = MemorySource({"mine": "[disk]\nreadahead=512\n"})
    # /lib/mine including "mine" must not find itself (the source skips its own directory).
    result = import_profile(Found("/lib/mine/tuned.conf", "/lib", "[main]\ninclude=mine\n"), "mine", source)
    assert reasons(result)["include = mine"] == "no such profile in the TuneD profile directories"
    result = import_profile(Found("/etc/tuned/mine/tuned.conf", "/etc/tuned", "[main]\ninclude=mine\n"),
                            "mine", source)
    assert settings(result) == [("disk", {"kind": ["disk"]}, {"read_ahead_kb": 512})]


def test_catalog_sysctls_and_device_attributes_convert() -> None:
    result = run("[sysctl]\ndev.raid.speed_limit_min = 50000\nvm.swappiness=1\n"
                 "[sysfs]\n/sys/block/md*/md/stripe_cache_size = 4096\n"
                 "/sys/class/block/sd*/device/queue_depth = 16\n/sys/block/sd*/queue/wbt_lat_usec = >0\n")
    assert settings(result) == [
        ("sysctl", {"kind": ["host"]}, {"dev.raid.speed_limit_min": 50000}),
        ("sysfs-md", {"name": ["md*"]}, {"stripe_cache_size": 4096}),
        ("sysfs-sd", {"name": ["sd*"]}, {"queue_depth": 16}),
    ]
    assert reasons(result)["/sys/block/sd*/queue/wbt_lat_usec = >0"].startswith("'>' (only raise)")


# Export --------------------------------------------------------------------------------


def test_export_leaves_out_what_tuned_cannot_select_and_round_trips_the_rest() -> None:
    from stortune.schemas.profile import StorageProfile

    profile = StorageProfile.model_validate({
        "metadata": {"name": "mixed"},
        "spec": {"rules": [
            {"name": "disks", "match": {"kind": ["disk"], "name": ["sd*", "vd?"]},
             "settings": {"read_ahead_kb": 4096, "scheduler": "mq-deadline", "nr_requests": 128}},
            {"name": "all", "match": {"kind": ["disk"]}, "settings": {"read_ahead_kb": 512, "nomerges": 1}},
            {"name": "md", "match": {"name": ["md*"]}, "settings": {"stripe_cache_size": 8192}},
            {"name": "raid", "match": {"kind": ["host"]}, "settings": {"dev.raid.speed_limit_max": 200000}},
            {"name": "ssd", "match": {"rotational": False}, "settings": {"scheduler": "none"}},
            {"name": "odd", "match": {"name": ["sd[a,b]"]}, "settings": {"nomerges": 2}},
        ]},
    })
    exported = export_profile(profile)
    assert exported.left_out == [
        "rule all: nomerges matches by kind ['disk'] only; [sysfs] globs cannot select by kind",
        "rule ssd: matches on rotational, which TuneD units cannot select by; left out: scheduler",
        "rule odd: name globs ['sd[a,b]'] cannot be written in a TuneD device list; left out: nomerges",
    ]
    back = import_profile(Found("/x/mixed/tuned.conf", "/x", exported.text), "mixed", MemorySource({}))
    assert back.skipped == [] and back.notes == []
    assert settings(back) == [
        ("disks-disk", {"kind": ["disk"], "name": ["sd*", "vd?"]},
         {"read_ahead_kb": 4096, "scheduler": "mq-deadline"}),
        ("disks-sysfs-sd", {"name": ["sd*"]}, {"nr_requests": 128}),
        ("disks-sysfs-vd", {"name": ["vd?"]}, {"nr_requests": 128}),
        ("all-disk", {"kind": ["disk"]}, {"read_ahead_kb": 512}),
        ("md-sysfs-md", {"name": ["md*"]}, {"stripe_cache_size": 8192}),
        ("raid-sysctl", {"kind": ["host"]}, {"dev.raid.speed_limit_max": 200000}),
    ]
