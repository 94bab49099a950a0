"""The Bemis–Murcko scaffold split of MoleculeNet (Wu et al. 2018), as DeepChem's ``ScaffoldSplitter`` does it:

1. each molecule's scaffold is its Bemis–Murcko framework (ring systems and the linkers between them, side chains
   removed), as canonical SMILES from RDKit's ``MurckoScaffold.MurckoScaffoldSmiles`` (chirality ignored; every
   acyclic molecule has the empty scaffold ``""``);
2. molecules are grouped by scaffold and the groups sorted by size, largest first (ties: the group whose first
   molecule comes later in the input first, as DeepChem sorts);
3. groups go to train while train stays within 80 % of the molecules, else to validation while train + validation
   stay within 90 %, else to test.

So no scaffold is shared between train, validation and test: the test molecules have ring systems never seen in
training (the rare scaffolds end up there), a harder and more realistic test than a random split. The split is
deterministic (no seed): every run of every variant sees the same split.

Written here because the rule is DeepChem's (not a dependency); RDKit computes the scaffolds.
"""

from __future__ import annotations

from collections import defaultdict

FRACTIONS = (0.8, 0.1, 0.1)


def scaffold(smiles: str) -> str:
    """The Bemis–Murcko scaffold of a molecule as canonical SMILES ("" for an acyclic molecule)."""
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"RDKit cannot parse the SMILES {smiles!r}")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False)


def scaffold_split(smiles: list[str], fractions: tuple[float, float, float] = FRACTIONS
                   ) -> tuple[list[int], list[int], list[int]]:
    """Indices of (train, validation, test) by the rule of the module docstring."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(smiles):
        groups[scaffold(s)].append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    train_cut, val_cut = fractions[0] * len(smiles), (fractions[0] + fractions[1]) * len(smiles)
    train, val, test = [], [], []
    for group in ordered:
        if len(train) + len(group) <= train_cut:
            train += group
        elif len(train) + len(val) + len(group) <= val_cut:
            val += group
        else:
            test += group
    return sorted(train), sorted(val), sorted(test)
