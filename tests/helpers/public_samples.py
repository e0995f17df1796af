"""Small CSVs shaped like public datasets' samples (generated, not copied): Avazu (a 20-digit id, a
YYMMDDHH hour, hex strings, all categorical), MovieLens ("|"-joined genres, a timestamp) and
census-income (two labels, a sample weight, capital gains mostly 0). Each comes with the flags a
user gives `convert` and `inspect` for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def avazu(path: Path, rows: int = 600) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(1)
    sites = [f"{v:08x}" for v in rng.integers(0, 2**32, 40)]
    lines = ["id,click,hour,C1,banner_pos,site_id,app_id,device_model,device_type,C14,C15"]
    for k in range(rows):
        site = int(rng.integers(0, 40))
        click = int(rng.random() < (0.3 if site < 10 else 0.1))
        lines.append(
            f"{10**19 + int(rng.integers(0, 10**18))},{click},{14102100 + int(rng.integers(0, 4))},1005,"
            f"{int(rng.integers(0, 2))},{sites[site]},ecad2386,{['a1', 'b2', 'c3'][k % 3]},1,"
            f"{int(rng.integers(15000, 21000))},320"
        )
    path.write_text("\n".join(lines) + "\n")
    return [], ["--label", "click"]


def movielens(path: Path, rows: int = 600) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(2)
    genres = ["Comedy", "Drama", "Action", "Thriller", "Romance"]
    lines = ["userId,movieId,timestamp,genres,liked"]
    for _ in range(rows):
        g = rng.choice(genres, int(rng.integers(1, 4)), replace=False)
        liked = int(rng.random() < (0.7 if "Drama" in g else 0.3))
        lines.append(
            f"{int(rng.integers(1, 80))},{int(rng.integers(1, 200))},{964982703 + int(rng.integers(0, 10**6))},"
            f"{'|'.join(g)},{liked}"
        )
    path.write_text("\n".join(lines) + "\n")
    return ["--multi", "genres:string"], ["--label", "liked"]


def census(path: Path, rows: int = 600) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(3)
    lines = ["age,class_of_worker,education,capital_gains,instance_weight,income_50k,never_married"]
    for _ in range(rows):
        age = int(rng.integers(17, 90))
        edu = str(rng.choice(["Bachelors", "HS-grad", "Masters", "Doctorate"]))
        gains = int(rng.choice([0] * 9 + [int(rng.integers(100, 99999))]))
        income = int(rng.random() < (0.5 if edu in ("Masters", "Doctorate") else 0.1))
        lines.append(
            f"{age},{rng.choice(['Private', 'Self-emp', 'Federal'])},{edu},{gains},{rng.normal(1800, 400):.2f},"
            f"{income},{int(age < 30 and rng.random() < 0.8)}"
        )
    path.write_text("\n".join(lines) + "\n")
    return [], ["--label", "income_50k", "--label", "never_married", "--weight", "instance_weight"]


SAMPLES = {"avazu": avazu, "movielens": movielens, "census": census}
