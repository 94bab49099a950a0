"""Build ``kicad15.npz``: surface point clouds of real KiCad 3D part models, 15 classes.

Source
------
Debian package ``kicad-packages3d`` 6.0.10-1 (upstream
https://gitlab.com/kicad/libraries/kicad-packages3D), used only at build time::

    mkdir -p /tmp/kicad && cd /tmp/kicad
    apt-get download kicad-packages3d        # run `apt-get update` first if it fails
    dpkg-deb -x kicad-packages3d_*.deb /tmp/kicad/root
    python tasks/points/scripts/build_kicad_shapes.py /tmp/kicad/root/usr/share/kicad/3dmodels

The package holds ~6,200 VRML 2 models in ``<Category>.3dshapes/*.wrl`` (``.step`` files are
ignored). Almost all are flat kicad-StepUp exports (a list of ``Shape { ... IndexedFaceSet
{ coordIndex [...] coord Coordinate { point [...] } } }`` with ``DEF``/``USE`` materials); a
handful use ``Group``/``Transform``/``Switch`` with ``DEF``/``USE`` coordinates. The small
tokenizer + recursive-descent parser below handles all of these; a file that fails to parse or
has no triangle area is skipped and counted (``--survey`` parses the whole library: all 6,227
models of 6.0.10-1 parse, 0 failures). Polygons are fan-triangulated.

Licence / attribution
---------------------
KiCad 3D models (c) the KiCad library contributors, licensed CC-BY-SA-4.0 with the KiCad
library exception (https://gitlab.com/kicad/libraries/kicad-packages3D/-/blob/master/LICENSE.md).
The derived point clouds keep that licence and attribution.

Classes
-------
Folders with >= 77 parseable models, picked so that each class is a visually different kind of
part; where several folders hold near-identical geometry only one represents the family:

- ``Capacitor_THT``: film boxes, electrolytic cans, disc capacitors on leads.
- ``Resistor_THT``: mostly axial resistors, some SIP arrays (stands in for ``Diode_THT``,
  the same axial bodies).
- ``Inductor_THT``: radial/axial coils and common-mode chokes.
- ``Crystal``: SMD crystals, HC-49/HC-52 cans, resonators.
- ``LED_THT``: domed/rectangular LEDs on long leads.
- ``Package_DIP``: through-hole dual-in-line ICs.
- ``Package_SO``: gull-wing two-sided SMD ICs (``Package_QFP`` left out as the same family).
- ``Package_DFN_QFN``: leadless flat SMD packages (``Package_BGA`` left out, also flat slabs).
- ``Package_TO_SOT_THT``: TO-92/TO-220/TO-18 style transistor packages on leads.
- ``Connector_PinHeader_2.54mm``: pin headers (one of the 1.00/1.27/2.00/2.54 mm header and
  socket folders, which are the same strips at different pitch).
- ``Connector_Phoenix_MSTB``: pluggable terminal blocks (one of the Phoenix MSTB/MC/GMSTB/
  terminal-block folders).
- ``Connector_JST``: small shrouded wire-to-board connectors (``Connector_Molex`` is similar).
- ``Connector_Dsub``: D-sub connectors with metal shell.
- ``Button_Switch_SMD``: SMD DIP-switch banks and tactile switches.
- ``Mounting_Wuerth``: threaded standoffs and spacers.

Also left out: ``Varistor`` (disc bodies, as ``C_Disc`` in ``Capacitor_THT``) and
``Capacitor_SMD`` (chip boxes and cans already covered by other classes).

Per class at most 60 models: files sorted by name, permuted with ``default_rng(0)``, parsed in
that order until 60 succeed. Each model: 1,024 area-weighted surface samples (seed from a
hash of ``<class>/<stem>``), centred on the centroid, scaled into the unit sphere, float16.
Split per class by model family (the name with numbers replaced): whole families go to test until
>= 20% of the models are there, so test models have no near-twins in training. Arrays: ``points`` (N, 1024, 3) float16,
``labels`` (N,) int64, ``split`` (N,) uint8 (0 train, 1 test), ``classes`` (15,) str,
``names`` (N,) str (file stem).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_ROOT = Path("/tmp/kicad/root/usr/share/kicad/3dmodels")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "quest_points" / "data" / "kicad15.npz"

CLASSES: tuple[str, ...] = (
    "Capacitor_THT",
    "Resistor_THT",
    "Inductor_THT",
    "Crystal",
    "LED_THT",
    "Package_DIP",
    "Package_SO",
    "Package_DFN_QFN",
    "Package_TO_SOT_THT",
    "Connector_PinHeader_2.54mm",
    "Connector_Phoenix_MSTB",
    "Connector_JST",
    "Connector_Dsub",
    "Button_Switch_SMD",
    "Mounting_Wuerth",
)
MAX_PER_CLASS = 60
NUM_POINTS = 1024
TEST_FRACTION = 0.2

# ---------------------------------------------------------------------------------------------
# VRML 2 parsing
# ---------------------------------------------------------------------------------------------

# Numeric arrays are taken whole (they hold nearly all the bytes); commas are whitespace.
TOKEN_RE = re.compile(
    r"""(?P<comment>\#[^\n]*)
      | (?P<array>\[[-+.\deE\s,]*\])
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<punct>[{}\[\]])
      | (?P<word>[^\s,{}\[\]"\#]+)""",
    re.VERBOSE,
)
SCALAR_RE = re.compile(r"[-+.\d]|TRUE$|FALSE$")


class ParseError(ValueError):
    """The file is not VRML 2 that this parser understands."""


# What a malformed or unusual file can raise; such a file is skipped and counted.
PARSE_ERRORS = (ParseError, ValueError, IndexError, KeyError, RecursionError)


@dataclass
class Node:
    """A VRML node: its type and fields (a field holds a Node, list of Nodes, array or None)."""

    type: str
    fields: dict[str, object] = field(default_factory=dict)


class Parser:
    """Recursive-descent parser for the VRML 2 subset found in the KiCad library."""

    def __init__(self, text: str) -> None:
        self.tokens = [
            (m.lastgroup, m.group()) for m in TOKEN_RE.finditer(text) if m.lastgroup != "comment"
        ]
        self.pos = 0
        self.defs: dict[str, Node] = {}

    def peek(self, ahead: int = 0) -> tuple[str, str]:
        i = self.pos + ahead
        return self.tokens[i] if i < len(self.tokens) else ("eof", "")

    def take(self, expected: str | None = None) -> str:
        kind, text = self.peek()
        if kind == "eof" or (expected is not None and text != expected):
            raise ParseError(f"expected {expected or 'token'!r}, got {text!r} at token {self.pos}")
        self.pos += 1
        return text

    def parse_file(self) -> list[Node]:
        nodes = []
        while self.peek()[0] != "eof":
            nodes.append(self.parse_node())
        return nodes

    def parse_node(self) -> Node:
        word = self.take()
        if word == "USE":
            name = self.take()
            if name not in self.defs:
                raise ParseError(f"USE of undefined {name!r}")
            return self.defs[name]
        if word == "DEF":
            name = self.take()
            node = self.parse_node()
            self.defs[name] = node
            return node
        if word in ("PROTO", "EXTERNPROTO", "ROUTE"):
            raise ParseError(f"unsupported statement {word}")
        node = Node(word)
        self.take("{")
        while self.peek()[1] != "}":
            name = self.take()
            node.fields[name] = self.parse_value()
        self.take("}")
        return node

    def parse_value(self) -> object:
        kind, text = self.peek()
        if kind == "array":
            self.pos += 1
            return parse_numbers(text[1:-1])
        if text == "[":  # list of nodes (or of strings / mixed scalars)
            self.pos += 1
            items: list[object] = []
            while self.peek()[1] != "]":
                items.append(self.parse_value())
            self.pos += 1
            return items
        if text == "NULL":
            self.pos += 1
            return None
        if text in ("DEF", "USE") or self.peek(1)[1] == "{":
            return self.parse_node()
        scalars = []  # SFVec3f, SFRotation, SFBool, strings, ...: run of scalar tokens
        while self.peek()[0] == "string" or (
            self.peek()[0] == "word" and SCALAR_RE.match(self.peek()[1])
        ):
            scalars.append(self.take())
        if not scalars:
            raise ParseError(f"unexpected {text!r} at token {self.pos}")
        try:
            return parse_numbers(" ".join(scalars))
        except ValueError:
            return scalars


def parse_numbers(text: str) -> np.ndarray:
    """Whitespace/comma separated numbers -> float64 array."""
    return np.array(text.replace(",", " ").split(), dtype=np.float64)


def fan_triangles(coord_index: np.ndarray) -> np.ndarray:
    """Fan-triangulate ``-1``-terminated polygons: (T, 3) vertex indices."""
    idx = coord_index.astype(np.int64)
    if len(idx) and idx[-1] != -1:
        idx = np.append(idx, -1)
    sep = idx < 0
    pos = np.arange(len(idx))
    starts = np.maximum.accumulate(np.where(np.r_[True, sep[:-1]], pos, 0))
    p = pos[:-1]
    ok = ~sep[:-1] & ~sep[1:] & (p > starts[:-1])
    return np.stack([idx[starts[:-1][ok]], idx[p[ok]], idx[p[ok] + 1]], axis=1)


def axis_angle(r: np.ndarray) -> np.ndarray:
    """4x4 rotation from a VRML rotation (x, y, z, angle)."""
    axis, angle = r[:3], r[3]
    out = np.eye(4)
    n = np.linalg.norm(axis)
    if n == 0 or angle == 0:
        return out
    x, y, z = axis / n
    k = np.array([[0, -z, y], [z, 0, -x], [-y, x, 0]])
    out[:3, :3] = np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * (k @ k)
    return out


def transform_matrix(node: Node) -> np.ndarray:
    """VRML Transform: T * C * R * SR * S * -SR * -C."""

    def shift(v: object) -> np.ndarray:
        m = np.eye(4)
        m[:3, 3] = np.asarray(v if v is not None else np.zeros(3))[:3]
        return m

    f = node.fields
    c = shift(f.get("center"))
    r = axis_angle(np.asarray(f.get("rotation", [0, 0, 1, 0]), dtype=float))
    sr = axis_angle(np.asarray(f.get("scaleOrientation", [0, 0, 1, 0]), dtype=float))
    s = np.diag(np.r_[np.asarray(f.get("scale", [1, 1, 1]), dtype=float)[:3], 1.0])
    return shift(f.get("translation")) @ c @ r @ sr @ s @ np.linalg.inv(sr) @ np.linalg.inv(c)


def as_nodes(value: object) -> list[Node]:
    if isinstance(value, Node):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, Node)]
    return []


def collect_triangles(
    node: Node, xf: np.ndarray, out: list[np.ndarray], seen: set[tuple[int, bytes]]
) -> None:
    """Append world-space triangles (T, 3, 3) of every IndexedFaceSet below ``node``.

    A node USEd again under the same transform is the same surface and is counted once.
    """
    key = (id(node), xf.tobytes())
    if key in seen:
        return
    seen.add(key)
    f = node.fields
    if node.type == "Transform":
        xf = xf @ transform_matrix(node)
    if node.type == "Switch":
        choice = int(np.asarray(f.get("whichChoice", [-1])).ravel()[0])
        chosen = as_nodes(f.get("choice"))
        children = [chosen[choice]] if 0 <= choice < len(chosen) else []
    elif node.type == "LOD":
        children = as_nodes(f.get("level"))[:1]
    elif node.type == "Shape":
        children = as_nodes(f.get("geometry"))
    else:  # Group, Transform, Anchor, Billboard, Collision, ...
        children = as_nodes(f.get("children"))
    for child in children:
        collect_triangles(child, xf, out, seen)

    if node.type != "IndexedFaceSet":
        return
    coord = f.get("coord")
    index = f.get("coordIndex")
    if not isinstance(coord, Node) or not isinstance(index, np.ndarray):
        return
    points = np.asarray(coord.fields.get("point", np.zeros(0)), dtype=np.float64)
    if points.size % 3:
        raise ParseError("point array length not a multiple of 3")
    points = points.reshape(-1, 3) @ xf[:3, :3].T + xf[:3, 3]
    tri = fan_triangles(index)
    tri = tri[(tri >= 0).all(1) & (tri < len(points)).all(1)]
    if len(tri):
        out.append(points[tri])


def load_triangles(path: Path) -> np.ndarray:
    """All triangles of a .wrl file as (T, 3, 3) float64; raises ParseError on failure."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("#VRML V2.0"):
        raise ParseError("not a VRML 2.0 file")
    parts: list[np.ndarray] = []
    seen: set[tuple[int, bytes]] = set()
    for node in Parser(text).parse_file():
        collect_triangles(node, np.eye(4), parts, seen)
    if not parts:
        raise ParseError("no IndexedFaceSet triangles")
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------
# Sampling and dataset assembly
# ---------------------------------------------------------------------------------------------


def name_seed(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def sample_surface(tri: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` area-weighted uniform surface samples, centred and scaled into the unit sphere."""
    a, b, c = tri[:, 0], tri[:, 1], tri[:, 2]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    total = area.sum()
    if not np.isfinite(total) or total <= 0:
        raise ParseError("zero surface area")
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(tri), size=n, p=area / total)
    r1, r2 = np.sqrt(rng.random((n, 1))), rng.random((n, 1))
    pts = (1 - r1) * a[pick] + r1 * (1 - r2) * b[pick] + r1 * r2 * c[pick]
    pts -= pts.mean(0)
    radius = np.linalg.norm(pts, axis=1).max()
    if radius <= 0:
        raise ParseError("degenerate cloud")
    return pts / radius


def build_class(folder: Path, label: str) -> tuple[list[np.ndarray], list[str], int]:
    """Up to MAX_PER_CLASS clouds of one class folder; returns clouds, stems, parse failures."""
    files = sorted(folder.glob("*.wrl"))
    order = np.random.default_rng(0).permutation(len(files))
    clouds, stems, failures = [], [], 0
    for i in order:
        if len(clouds) == MAX_PER_CLASS:
            break
        path = files[i]
        try:
            tri = load_triangles(path)
            clouds.append(sample_surface(tri, NUM_POINTS, name_seed(f"{label}/{path.stem}")))
            stems.append(path.stem)
        except PARSE_ERRORS as err:
            failures += 1
            print(f"  skip {path.name}: {err}")
    return clouds, stems, failures


def family(stem: str) -> str:
    """A model's family: its name with every number replaced (``PinHeader_1x19_P2.54mm`` -> ``PinHeader_#x#_P#.#mm``)."""
    return re.sub(r"\d+", "#", stem)


def split_for(stems: list[str], seed: int) -> np.ndarray:
    """Deterministic ~80/20 train(0)/test(1) assignment by *family*: whole families go to test (in a seeded
    order) until at least 20 % of the models are there, so no test model has a near-twin in training that
    differs only in pin count or size (those are near-duplicates once scaled into the unit sphere)."""
    families = sorted({family(s) for s in stems})
    if len(families) < 2:
        raise SystemExit(f"only one model family in {stems[:3]}...: cannot split by family")
    split = np.zeros(len(stems), dtype=np.uint8)
    for f in np.random.default_rng(seed).permutation(families):
        if split.sum() >= TEST_FRACTION * len(stems):
            break
        split[[family(s) == f for s in stems]] = 1
    return split


def survey(root: Path) -> None:
    """Parse every model in every folder; print parseable/failed counts (the class shortlist)."""
    rows = []
    for folder in sorted(root.glob("*.3dshapes")):
        ok = failed = 0
        for path in sorted(folder.glob("*.wrl")):
            try:
                sample_surface(load_triangles(path), 16, 0)
                ok += 1
            except PARSE_ERRORS as err:
                failed += 1
                print(f"  fail {folder.name}/{path.name}: {err}")
        rows.append((ok, failed, folder.name.removesuffix(".3dshapes")))
    for ok, failed, name in sorted(rows, reverse=True):
        print(f"{ok:5d} ok {failed:4d} failed  {name}")
    print(f"total: {sum(r[0] for r in rows)} ok, {sum(r[1] for r in rows)} failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, nargs="?", default=DEFAULT_ROOT,
                    help="extracted .../usr/share/kicad/3dmodels folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--survey", action="store_true",
                    help="only count parseable models per folder (all ~6,200 files, minutes)")
    args = ap.parse_args()
    if args.survey:
        survey(args.root)
        return

    start = time.time()
    points, labels, split, names = [], [], [], []
    rows = []
    for label, cls in enumerate(CLASSES):
        folder = args.root / f"{cls}.3dshapes"
        if not folder.is_dir():
            raise SystemExit(f"missing {folder}; see the module docstring for how to get it")
        clouds, stems, failures = build_class(folder, cls)
        cls_split = split_for(stems, seed=label)
        points += clouds
        names += stems
        labels += [label] * len(clouds)
        split.append(cls_split)
        rows.append((cls, int((cls_split == 0).sum()), int(cls_split.sum()), failures))
        print(f"{cls:28s} {len(clouds):3d} models, {failures} parse failures")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(  # zip entries carry a fixed 1980 timestamp: the bytes are reproducible
        args.out,
        points=np.stack(points).astype(np.float16),
        labels=np.asarray(labels, dtype=np.int64),
        split=np.concatenate(split),
        classes=np.asarray(CLASSES),
        names=np.asarray(names),
    )

    print(f"\n{'class':28s} {'train':>5s} {'test':>5s} {'fail':>5s}")
    for cls, n_train, n_test, failures in rows:
        print(f"{cls:28s} {n_train:5d} {n_test:5d} {failures:5d}")
    tot = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'total':28s} {tot[0]:5d} {tot[1]:5d} {tot[2]:5d}")
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    size = args.out.stat().st_size
    elapsed = time.time() - start
    print(f"\nwrote {args.out} ({size / 1e6:.2f} MB, sha256 {digest[:16]}) in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
