"""Morgan fingerprints of SMILES as packed bits, and the most Tanimoto-similar rows of a fingerprint table.

The search is a matrix product: for 0/1 vectors the intersection count |a & b| is their dot product, so a
block of queries against a block of the table is one float32 matmul (exact: counts stay far below 2**24),
Tanimoto is |a & b| / (|a| + |b| - |a & b|), and a running top-k keeps k candidates per query. Memory is
bounded by the block sizes, not by the table: the table stays packed (n_bits / 8 bytes a row).
"""

from __future__ import annotations

import multiprocessing
from typing import Sequence

import numpy as np

# Below this many SMILES, worker processes cost more to start than they save.
_PARALLEL_FROM = 20_000


def _packed_chunk(args: tuple[list[str], int, int]) -> np.ndarray:
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdFingerprintGenerator

    smiles, radius, n_bits = args
    RDLogger.DisableLog("rdApp.*")
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    out = np.zeros((len(smiles), n_bits // 8), dtype=np.uint8)
    for row, text in enumerate(smiles):
        mol = Chem.MolFromSmiles(text) if isinstance(text, str) and text else None
        if mol is not None:  # a SMILES RDKit cannot read keeps an empty fingerprint: similar to nothing
            out[row] = np.packbits(generator.GetFingerprintAsNumPy(mol))
    return out


def morgan_packed(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048, n_jobs: int = 1) -> np.ndarray:
    """``(len(smiles), n_bits // 8)`` uint8: each SMILES's Morgan bit vector (radius `radius`), packed; zeros
    where RDKit cannot read it. Repeated SMILES are computed once; `n_jobs` processes for large inputs."""
    if n_bits % 8:
        raise ValueError(f"n_bits must be a multiple of 8, not {n_bits}")
    # A dict, not np.unique: a fixed-width string array of a million SMILES would take gigabytes.
    first: dict[str, int] = {}
    inverse = np.fromiter((first.setdefault(s, len(first)) for s in smiles), dtype=np.int64, count=len(smiles))
    unique = list(first)
    if n_jobs > 1 and len(unique) >= _PARALLEL_FROM:
        size = -(-len(unique) // (4 * n_jobs))
        chunks = [(unique[i : i + size], radius, n_bits) for i in range(0, len(unique), size)]
        # fork: workers need only RDKit and this module, and start in milliseconds
        with multiprocessing.get_context("fork").Pool(n_jobs) as pool:
            table = np.concatenate(pool.map(_packed_chunk, chunks))
    else:
        table = _packed_chunk((unique, radius, n_bits))
    return table[inverse] if unique else np.zeros((0, n_bits // 8), dtype=np.uint8)


def _unpack(packed: np.ndarray):
    import torch

    return torch.from_numpy(np.unpackbits(packed, axis=1)).to(torch.float32)


def top_k_similar(queries: np.ndarray, table: np.ndarray, k: int, table_rows: int = 8192,
                  query_rows: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """For each packed query, the rows of packed `table` with the `k` highest Tanimoto similarities, most
    similar first: ``(indices, similarities)``, each ``(len(queries), min(k, len(table)))``. Two empty
    fingerprints have similarity 0."""
    import torch

    k = min(k, len(table))
    indices = np.zeros((len(queries), k), dtype=np.int64)
    sims = np.zeros((len(queries), k), dtype=np.float32)
    if k == 0:
        return indices, sims
    for qs in range(0, len(queries), query_rows):
        q = _unpack(queries[qs : qs + query_rows])
        q_count = q.sum(1, keepdim=True)
        best_sim = torch.full((len(q), 0), 0.0)
        best_idx = torch.zeros((len(q), 0), dtype=torch.long)
        for ts in range(0, len(table), table_rows):
            t = _unpack(table[ts : ts + table_rows])
            inter = q @ t.T
            union = q_count + t.sum(1)[None, :] - inter
            sim = torch.where(union > 0, inter / union.clamp(min=1.0), torch.zeros(()))
            top_sim, top_idx = torch.topk(sim, min(k, sim.shape[1]), dim=1)
            cand_sim = torch.cat([best_sim, top_sim], 1)
            cand_idx = torch.cat([best_idx, top_idx + ts], 1)
            best_sim, pos = torch.topk(cand_sim, min(k, cand_sim.shape[1]), dim=1)
            best_idx = torch.gather(cand_idx, 1, pos)
        indices[qs : qs + len(q)] = best_idx.numpy()
        sims[qs : qs + len(q)] = best_sim.numpy()
    return indices, sims
