"""dlrm.optim.state_moves: the embedding optimizer state keyed and shaped as a checkpoint saved it
(the 2-rank resumes across plans are in tests/checkpoint/test_resume_matrix.py)."""

import torch

from dlrm.optim.state_moves import fit_to_checkpoint

W = "model.sparse_arch.embedding_bag_collection.embedding_bags.t_C1.weight"


def test_the_same_layout_is_left_as_it_is():
    ours = {W: {"t_C1.momentum1": torch.zeros(4)}}
    fitted, _, misfits = fit_to_checkpoint(ours, {f"optim.state.{W}.t_C1.momentum1": torch.Size([4])}, torch.tensor(3))
    assert fitted == ours and misfits == []


def test_fused_state_loads_into_the_data_parallel_sum_and_the_step_is_the_resumed_one():
    ours = {W: {"step": torch.tensor(0.0), "sum": torch.zeros(4, 1)}}
    step = torch.tensor([0])
    fitted, finish, misfits = fit_to_checkpoint(ours, {f"optim.state.{W}.t_C1.momentum1": torch.Size([4])}, step)
    assert misfits == [] and list(fitted[W]) == ["t_C1.momentum1"]
    fitted[W]["t_C1.momentum1"].copy_(torch.arange(4.0))  # what DCP's load does, in place
    step.fill_(7)  # loaded with the rest
    finish()
    assert ours[W]["sum"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0] and ours[W]["step"].item() == 7.0


def test_a_saved_state_of_another_size_is_a_misfit():
    ours = {W: {"step": torch.tensor(0.0), "sum": torch.zeros(4, 1)}}
    _, _, misfits = fit_to_checkpoint(ours, {f"optim.state.{W}.t_C1.momentum1": torch.Size([8])}, torch.tensor(0))
    assert misfits == [W]
