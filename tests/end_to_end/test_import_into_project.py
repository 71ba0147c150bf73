"""Importing the parts into someone else's Lightning project: no CLI, no MLflow, a plain Trainer."""

import subprocess
import sys
import textwrap

import pytest

PROJECT_FILES = {
    "myproject/__init__.py": "",
    "myproject/net.py": '''
        import torch
        from torch import nn


        class TwoLayer(nn.Module):
            """The project's own network."""

            def __init__(self, in_features: int = 4, hidden: int = 32, classes: int = 2):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, classes))

            def forward(self, x):
                return self.body(x)
    ''',
    "myproject/data.py": '''
        import lightning as L
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from datamodules.samplers import ClassBalancedSampler


        class ImbalancedBlobs(L.LightningDataModule):
            """The project's own data module: 90/10 classes, balanced train sampling."""

            def __init__(self, n: int = 1000, seed: int = 0):
                super().__init__()
                g = torch.Generator().manual_seed(seed)
                y = (torch.rand(n, generator=g) < 0.1).long()
                x = torch.randn(n, 4, generator=g) + 2.5 * y.unsqueeze(1).float()
                self.train_set = TensorDataset(x[:800], y[:800])
                self.val_set = TensorDataset(x[800:], y[800:])
                self.seed = seed

            def train_dataloader(self):
                labels = self.train_set.tensors[1]
                sampler = ClassBalancedSampler(labels, seed=self.seed)
                return DataLoader(self.train_set, batch_size=32, sampler=sampler)

            def val_dataloader(self):
                return DataLoader(self.val_set, batch_size=100)
    ''',
    "train.py": '''
        import sys

        import lightning as L
        import torch

        from lightning_modules import ClassificationModule
        from myproject.data import ImbalancedBlobs
        from myproject.net import TwoLayer

        out = sys.argv[1]
        L.seed_everything(0)
        data = ImbalancedBlobs()
        module = ClassificationModule(TwoLayer(), num_classes=2,
                                      optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
        trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=out)
        trainer.fit(module, data)
        metrics = trainer.validate(module, data, verbose=False)[0]
        trainer.save_checkpoint(f"{out}/model.ckpt")
        module.eval()
        with torch.no_grad():
            probs = torch.cat(trainer.predict(module, data.val_dataloader()))
        torch.save({"probs": probs, "val_acc": metrics["val/acc"]}, f"{out}/expected.pt")
    ''',
    "reload.py": '''
        import sys

        import torch

        from lightning_modules import ClassificationModule
        from myproject.data import ImbalancedBlobs
        from myproject.net import TwoLayer

        out = sys.argv[1]
        module = ClassificationModule.load_from_checkpoint(f"{out}/model.ckpt", model=TwoLayer())
        module.eval()
        x = ImbalancedBlobs().val_set.tensors[0]
        with torch.no_grad():
            probs = module.predict_step((x,), 0)
        torch.save(probs, f"{out}/reloaded.pt")
    ''',
}


@pytest.mark.slow
def test_modules_work_in_another_project_with_a_plain_trainer(tmp_path):
    import torch

    for name, text in PROJECT_FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    out = tmp_path / "out"
    out.mkdir()
    for script in ("train.py", "reload.py"):  # two fresh processes: train + save, then reload + predict
        done = subprocess.run([sys.executable, script, str(out)], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    expected = torch.load(out / "expected.pt")
    assert expected["val_acc"] > 0.9  # separable blobs, learned with balanced sampling
    assert torch.allclose(torch.load(out / "reloaded.pt"), expected["probs"], atol=1e-6)
    # no MLflow store, no recipes checkpoints: the project owns its outputs
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "checkpoints").exists()
    assert "recipes" not in (tmp_path / "train.py").read_text()
