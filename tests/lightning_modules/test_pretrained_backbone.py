"""A pretrained image backbone by class_path (a torchvision-like network the test defines) through a recipe:
init_from with a new head, frozen stem with its batch norm in eval mode, a lower learning rate for a stage."""

from __future__ import annotations

import pytest
import torch

from recipes.cli import main
from tests.conftest import runs_of
from tests.stand_in_backbones import TinyResNet

pytestmark = pytest.mark.usefixtures("one_thread")

# what the README shows for torchvision's resnet18, with the stand-in class and a small digits run
RECIPE = """\
seed_everything: 0
trainer:
  max_epochs: 3
  log_every_n_steps: 10
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: tests.stand_in_backbones.TinyResNet   # torchvision.models.resnet18 in real use
    init_from:
      path: imagenet_weights.pth       # torch.save(resnet18(weights=...).state_dict(), path) or a .safetensors
      exclude: [fc]                    # a new head for this data's classes
    freeze: [conv1, bn1, layer1]       # trained as they come; bn1's statistics stay the pretrained ones
    lr_multipliers: {layer2: 0.1}      # the last stage adapts slowly, fc at the full rate
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.01}
data:
  class_path: datamodules.DigitsDataModule
  init_args: {batch_size: 64, seed: 0}
"""


@pytest.mark.slow
def test_a_pretrained_backbone_by_class_path_with_a_new_head_frozen_stem_and_slower_stage(workdir, capsys):
    torch.manual_seed(3)
    pretrained = TinyResNet(num_classes=1000, in_channels=1)  # "ImageNet" weights: 1,000 classes
    with torch.no_grad():  # statistics a real pretrained network would have
        pretrained.bn1.running_mean.uniform_(-1, 1)
        pretrained.bn1.running_var.uniform_(0.5, 2)
    torch.save(pretrained.state_dict(), workdir / "imagenet_weights.pth")
    (workdir / "backbone.yaml").write_text(RECIPE)
    main(["fit", "-c", "backbone.yaml"])
    out = capsys.readouterr().out
    assert "init_from imagenet_weights.pth: 18 tensors" in out and "2 excluded: fc.weight, fc.bias" in out
    run = runs_of(workdir, "backbone")[0]
    assert run.data.params["plan.frozen_parameters"] == str(16 * 9 + 32 + 16 * 16 * 9 + 32)  # conv1, bn1, layer1
    best = torch.load(workdir / "checkpoints" / "backbone" / run.info.run_id / "best.ckpt", weights_only=True)
    best = best["state_dict"]
    start = pretrained.state_dict()
    for key in ("conv1.weight", "bn1.weight", "bn1.running_mean", "bn1.running_var", "layer1.0.weight",
                "layer1.1.running_mean"):
        assert torch.equal(best[f"model.{key}"], start[key]), key  # frozen: weights and statistics as loaded
    assert not torch.equal(best["model.layer2.0.weight"], start["layer2.0.weight"])
    assert best["model.fc.weight"].shape == (10, 32)  # the data's 10 classes, linked from the data module
    lrs = {k: v for k, v in run.data.metrics.items() if k.startswith("lr-AdamW/")}  # no schedule: named by optimizer
    assert lrs["lr-AdamW/layer2/decay"] == pytest.approx(0.001) and lrs["lr-AdamW/decay"] == pytest.approx(0.01)
    assert run.data.metrics["val/acc"] > 0.5  # ten classes: chance is 0.1
