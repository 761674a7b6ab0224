"""The demo's PNG charts (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display here, ever
    import matplotlib.pyplot as plt

    return plt


def supply_chart(rows: list[dict[str, Any]], path: Path, token: str, decimals: int = 18) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    xs = [r["block_number"] for r in rows]
    ys = [int(r["total_supply"]) / 10**decimals for r in rows]
    ax.step(xs, ys, where="post", color="#1f77b4")
    ax.set_title(f"Total supply by block — {token[:10]}…")
    ax.set_xlabel("block")
    ax.set_ylabel(f"supply (÷10^{decimals})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def holders_chart(rows: list[dict[str, Any]], path: Path, token: str, decimals: int = 18) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    series: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        xs, ys = series.setdefault(r["account"], ([], []))
        xs.append(r["block_number"])
        ys.append(int(r["balance"]) / 10**decimals)
    for account, (xs, ys) in series.items():
        ax.step(xs, ys, where="post", label=f"{account[:8]}…{account[-4:]}")
    ax.set_title(f"Balances of the top {len(series)} holders at the tip — {token[:10]}…")
    ax.set_xlabel("block")
    ax.set_ylabel(f"balance (÷10^{decimals})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
