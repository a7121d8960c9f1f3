"""Chapter 8's machine check (notebooks/machine_check.py), driven with made-up machines."""
import pytest
import torch

from notebooks.machine_check import check, gather_facts, pairs_in_child, runs_on

CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
RELEASES = {"12.6": {"x86_64": {50, 60, 70, 75, 80, 86, 90}},
            "13.0": {"x86_64": {75, 80, 86, 90, 100, 120}}}


def machine(**changes):
    """A healthy machine with two RTX 4090s and a cu130 wheel, with `changes` made."""
    facts = {"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "capability": (8, 9)},
                      {"index": 1, "name": "NVIDIA GeForce RTX 4090", "capability": (8, 9)}],
             "peer": {(0, 1): True, (1, 0): True}, "copies_equal": {(0, 1): True, (1, 0): True},
             "shm_bytes": 16 * 2**30, "driver": "580.159.04", "torch": "2.14.1+cu130",
             "cuda": "13.0", "arch_list": CU130, "releases": RELEASES}
    facts.update(changes)
    return facts


def by_topic(findings):
    return {topic: (status, text) for status, topic, text in findings}


def test_right_case_a_healthy_machine_needs_no_change():
    assert {status for status, _, _ in check(machine())} == {"ok"}


def test_planted_docker_default_shm_asks_for_shm_size():
    status, text = by_topic(check(machine(shm_bytes=64 * 2**20)))["/dev/shm"]
    assert status == "change"
    assert "64 MiB (Docker's default)" in text
    assert "--shm-size" in text and "--ipc=host" in text and "NCCL_SHM_DISABLE=1" in text
    assert "Bus error" in text and "Error while creating shared memory segment" in text


def test_planted_gpus_without_peer_to_peer_are_named():
    findings = by_topic(check(machine(peer={(0, 1): False, (1, 0): False})))
    status, text = findings["peer-to-peer"]
    assert status == "change"
    assert "GPUs 0-1" in text and "NCCL_P2P_DISABLE=1" in text and "ACS" in text
    assert findings["copies"][0] == "ok"


def test_planted_a_copy_that_comes_back_wrong_warns_against_dataparallel():
    status, text = by_topic(check(machine(copies_equal={(0, 1): False, (1, 0): True})))["copies"]
    assert status == "change"
    assert "cuda:0 -> cuda:1" in text and "DataParallel" in text


def test_planted_titan_xp_and_v100_have_no_code_in_the_cu130_build():
    gpus = [{"index": 0, "name": "NVIDIA TITAN Xp", "capability": (6, 1)},
            {"index": 1, "name": "Tesla V100-SXM2-16GB", "capability": (7, 0)}]
    findings = [f for f in check(machine(gpus=gpus)) if f[1] == "GPU code"]
    assert [status for status, _, _ in findings] == ["change", "change"]
    for _, _, text in findings:
        assert "no kernel image is available for execution on the device" in text
        assert "--index-url https://download.pytorch.org/whl/cu126" in text
        assert "whl/cu130" not in text


def test_planted_a_driver_too_old_for_cuda_13_is_named():
    status, text = by_topic(check(machine(driver="550.54.15")))["driver"]
    assert status == "change"
    assert "older than 580" in text and "driver on your system is too old" in text
    assert "whl/cu126" in text


def test_right_case_a_cpu_machine_says_what_it_did_not_check():
    findings = by_topic(check(machine(gpus=[], peer={}, copies_equal={}, driver=None)))
    assert findings["driver"][0] == findings["GPU code"][0] == "not checked"
    assert "not on TITAN Xp" in findings["GPU code"][1]
    assert findings["peer-to-peer"][0] == "not checked"


def test_planted_a_cpu_only_build_on_a_gpu_machine():
    status, text = by_topic(check(machine(cuda=None, arch_list=[])))["torch build"]
    assert status == "change" and "without CUDA" in text


@pytest.mark.parametrize("arch, capability, expected", [
    ("sm_86", (8, 9), True), ("sm_86", (8, 0), False), ("sm_75", (7, 0), False),
    ("sm_90", (10, 0), False), ("compute_90", (10, 0), True), ("sm_90a", (9, 0), True)])
def test_runs_on(arch, capability, expected):
    assert runs_on(capability, arch) is expected


def test_runs_on_agrees_with_torch_for_discrete_gpus():
    torch_rule = getattr(torch.cuda, "_code_compatible_with_device", None)
    if torch_rule is None:
        pytest.skip("this torch has no _code_compatible_with_device to compare with")
    discrete = [61, 70, 75, 80, 86, 89, 90, 100, 120]
    for device in discrete:
        for code in [50, 60, 61, 70, 75, 80, 86, 89, 90, 100, 120]:
            assert runs_on(divmod(device, 10), f"sm_{code}") == torch_rule(device, code), (device, code)


def test_gather_facts_on_this_machine():
    facts = gather_facts()
    assert facts["arch_list"] == torch.cuda.get_arch_list()
    assert facts["cuda"] == torch.version.cuda
    assert {status for status, _, _ in check(facts)} <= {"ok", "change", "not checked"}


def test_strings_in_library_reads_whole_messages(tmp_path):
    from notebooks.machine_check import strings_in_library
    library = tmp_path / "libfake.so"
    library.write_bytes(b"\x7fELF\0CUDA initialization: \0The driver is too old (found \0other\0")
    assert strings_in_library(library, "initialization", "too old", "missing") == [
        "CUDA initialization: ", "The driver is too old (found ",
        "('missing' is not in libfake.so)"]


def test_planted_copies_that_hang_become_a_finding_not_a_frozen_notebook():
    """The pairs run in a child with a time limit: a child that never ends is ended."""
    facts = pairs_in_child(timeout_s=1, program="import time\ntime.sleep(600)\n")
    assert facts == {"peer": {}, "copies_equal": {},
                     "pairs_problem": "did not finish within 1 s and was ended"}
    status, text = by_topic(check(machine(**facts)))["peer-to-peer"]
    assert status == "change"
    assert "did not finish within 1 s" in text and "NCCL_P2P_DISABLE=1" in text
    assert "CUDA_VISIBLE_DEVICES=0,1" in text
    assert "copies" not in by_topic(check(machine(**facts)))   # nothing claimed about them


def test_planted_a_child_that_fails_is_a_finding_too():
    facts = pairs_in_child(timeout_s=120, program="raise SystemExit('no CUDA in the child')")
    assert facts["pairs_problem"] == "failed (exit status 1): no CUDA in the child"
    assert by_topic(check(machine(**facts)))["peer-to-peer"][0] == "change"


def test_the_childs_answer_is_read_back_pair_by_pair():
    answer = '{"peer": {"0,1": true, "1,0": false}, "copies_equal": {"0,1": true, "1,0": true}}'
    facts = pairs_in_child(timeout_s=120, program=f"print('warming up')\nprint({answer!r})")
    assert facts == {"peer": {(0, 1): True, (1, 0): False},
                     "copies_equal": {(0, 1): True, (1, 0): True}, "pairs_problem": None}


def test_the_child_program_imports_and_reads_no_pairs_without_gpus():
    """PAIRS_CHILD itself, run where the GPUs are fewer than two: it finds the module from
    any folder and answers with empty pairs."""
    if torch.cuda.device_count() > 1:
        pytest.skip("with several GPUs the child would compare them: gather_facts' test does")
    assert pairs_in_child() == {"peer": {}, "copies_equal": {}, "pairs_problem": None}
