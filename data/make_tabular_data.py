"""Writes the tabular example files of the recipes, deterministically (run from anywhere):

    python data/make_tabular_data.py

- ``churn.csv``: 3,000 generated customers, numeric and categorical columns, an imbalanced yes/no target
  (about 1 in 5 churn) that depends on interactions, so linear models do not get it all. Used by
  ``configs/tabular_mlp.yaml``.
- ``diabetes.csv``: scikit-learn's bundled diabetes data (442 patients, 10 numeric features, a disease
  progression score), written from the copy that ships inside scikit-learn: real data, no download. Used by
  ``configs/regression_mlp.yaml``.
"""

from __future__ import annotations

import csv
import io
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLANS = ["basic", "standard", "premium"]
REGIONS = ["north", "south", "east", "west"]
PAYMENTS = ["card", "bank", "cash", "voucher"]


def make_churn(n: int = 3000, seed: int = 0) -> str:
    """CSV text of the churn example."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["tenure_months", "monthly_charges", "support_calls", "age", "plan", "region", "payment",
                     "churn"])
    for _ in range(n):
        plan = rng.choices(PLANS, weights=[5, 3, 2])[0]
        region = rng.choice(REGIONS)
        payment = rng.choices(PAYMENTS, weights=[4, 3, 2, 1])[0]
        tenure = min(72, int(rng.expovariate(1 / 20)) + 1)
        base = {"basic": 30.0, "standard": 55.0, "premium": 90.0}[plan]
        charges = round(base + rng.gauss(0, 8), 2)
        calls = min(12, int(rng.expovariate(1 / 1.5)))
        age = int(min(85, max(18, rng.gauss(45, 14))))
        score = (
            -2.2
            - 0.06 * tenure
            + 0.55 * calls
            + 0.018 * (charges - 50)
            + (0.9 if payment == "cash" else 0.0)
            + (0.7 if payment == "voucher" else 0.0)
            + (0.6 if region == "south" and plan == "basic" else 0.0)
            + (0.8 if calls >= 4 and tenure < 12 else 0.0)
            - (0.5 if plan == "premium" and tenure > 24 else 0.0)
            + 0.012 * (age - 45) * (1 if plan == "basic" else -1)
        )
        churn = "yes" if rng.random() < 1 / (1 + math.exp(-score)) else "no"
        writer.writerow([tenure, f"{charges:.2f}", calls, age, plan, region, payment, churn])
    return out.getvalue()


def make_diabetes() -> str:
    """CSV text of scikit-learn's bundled diabetes data (unscaled features, target ``progression``)."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*data.feature_names, "progression"])
    for row, target in zip(data.data, data.target):
        writer.writerow([f"{v:g}" for v in row] + [f"{target:g}"])
    return out.getvalue()


def main() -> None:
    (HERE / "churn.csv").write_text(make_churn())
    (HERE / "diabetes.csv").write_text(make_diabetes())
    print(f"wrote {HERE / 'churn.csv'} and {HERE / 'diabetes.csv'}")


if __name__ == "__main__":
    main()
