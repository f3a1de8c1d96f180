"""The code view's user tree: the launcher's frames left out, frames that strayed to the root
merged where the program was seen calling them."""

from __future__ import annotations

from dlprof.analysis.user_code import is_launcher_frame, user_code


def paths(parents: list[int], names: list[str], new_of: list[int], old: int) -> str:
    node, parts = new_of[old], []
    while node:
        parts.append(names[node])
        node = parents[node]
    return "/".join(reversed(parts))


def test_launcher_frames_are_left_out_and_strays_merged_under_the_program() -> None:
    names = [
        "(all ops)",
        ".venv/bin/dlprof:6:<module>",  # 1, the console script
        "/home/u/lib/python3.11/site-packages/click/core.py:1414:invoke",  # 2
        "/home/u/src/dlprof/runner.py:69:run_target",  # 3
        "<frozen runpy>:291:run_path",  # 4
        "train.py:1:<module>",  # 5
        "train.py:5:main",  # 6
        "train.py:2:step",  # 7
        "torch/_tensor.py:566:backward",  # 8
        "/home/u/src/dlprof/cli/main.py:73:main",  # 9: a later cycle, its callers lost
        "train.py:2:step",  # 10
        "torch/_tensor.py:566:backward",  # 11
        "train.py:12:<module>",  # 12: the program's frame, named by the line running then
        "/home/u/src/dlprof/collectors/optimizer_steps.py:47:step_then_mark",  # 13
        "torch/optim/sgd.py:105:step",  # 14
    ]
    parents = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 0, 7, 13]
    new_parents, new_names, new_of = user_code(parents, names)
    assert paths(new_parents, new_names, new_of, 8) == "train.py:<module>/train.py:5:main/train.py:2:step/torch/_tensor.py:566:backward"
    # The stray step and its backward are the same nodes as the program's.
    assert new_of[10] == new_of[7] and new_of[11] == new_of[8]
    # The optimizer's step hangs from the user's step, the marker around it left out.
    assert paths(new_parents, new_names, new_of, 14) == "train.py:<module>/train.py:5:main/train.py:2:step/torch/optim/sgd.py:105:step"
    assert new_of[12] == new_of[5]
    # Left-out frames map to where their children went; none of them is a node.
    assert new_of[1] == new_of[2] == new_of[3] == new_of[4] == new_of[9] == 0
    assert not [name for name in new_names if is_launcher_frame(name)]
    assert all(parent < node for node, parent in enumerate(new_parents) if node)


def test_a_stray_frame_the_program_never_called_stays_at_the_root() -> None:
    names = ["(all ops)", "train.py:1:<module>", "train.py:5:main", "worker.py:9:loop"]
    parents = [-1, 0, 1, 0]
    new_parents, new_names, new_of = user_code(parents, names)
    assert new_parents[new_of[3]] == 0 and new_names[new_of[3]] == "worker.py:9:loop"


def test_launcher_frames_are_told_from_the_users() -> None:
    assert is_launcher_frame("dlprof:6:<module>")
    assert is_launcher_frame("/usr/lib/python3/dist-packages/click/core.py:911:invoke")
    assert not is_launcher_frame("train.py:5:main")
    assert not is_launcher_frame("mydlprof/train.py:5:main")
    assert not is_launcher_frame("torch/nn/modules/module.py:1782:_call_impl")
