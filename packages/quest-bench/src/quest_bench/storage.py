"""Run folders on storage the nodes do not mount: a cloud URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``)
through ``pyarrow.fs``, as Ray Train stores its checkpoints.

With ``sweep --storage URI`` a worker trains in a local scratch folder and mirrors it to
``URI/<suite>/runs/<run_id>/`` at every checkpoint and at the end; a retried attempt first pulls that folder back,
so it resumes from the last checkpoint. The driver copies each finished run's folder from the URI into the
results folder, where it alone writes ``result.json`` and the index.
"""

from __future__ import annotations

from pathlib import Path

from quest_sdk.checkpoint import FolderCheckpoints


class RunMirror:
    """One run folder's copy at ``uri`` (a folder URI)."""

    def __init__(self, uri: str):
        import pyarrow.fs as pafs

        self.uri = uri.rstrip("/")
        self.fs, self.path = pafs.FileSystem.from_uri(self.uri)

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type == pafs.FileType.Directory

    def push(self, folder: Path) -> None:
        """Copy every file of ``folder`` to the URI (replacing what is there under the same names)."""
        import pyarrow.fs as pafs

        self.fs.create_dir(self.path, recursive=True)
        pafs.copy_files(str(Path(folder).resolve()), self.path, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.fs)

    def pull(self, folder: Path) -> bool:
        """Copy the URI's files into ``folder``; False when there is nothing there yet."""
        import pyarrow.fs as pafs

        if not self.exists():
            return False
        Path(folder).mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path, str(Path(folder).resolve()), source_filesystem=self.fs,
                        destination_filesystem=pafs.LocalFileSystem())
        return True


class MirroredCheckpoints(FolderCheckpoints):
    """Checkpoints in the run folder, each followed by a push of the whole folder (curves, TensorBoard files,
    figures, the checkpoint) to the run's mirror."""

    def __init__(self, folder: Path, mirror: RunMirror):
        super().__init__(folder)
        self.folder, self.mirror = Path(folder), mirror

    def save(self, state: dict, step: int) -> None:
        super().save(state, step)
        self.mirror.push(self.folder)


def run_uri(storage: str, suite: str, run_id: str) -> str:
    return f"{storage.rstrip('/')}/{suite}/runs/{run_id}"


def check_storage(storage: str) -> None:
    """A clear error for a URI pyarrow cannot open (unknown scheme, missing credentials), before anything runs."""
    import pyarrow.fs as pafs

    try:
        pafs.FileSystem.from_uri(storage)
    except Exception as err:  # pyarrow raises ArrowInvalid/OSError/ValueError depending on the scheme
        raise ValueError(f"--storage {storage}: pyarrow cannot open it ({err}); give a URI such as s3://bucket/path, "
                         "gs://bucket/path or file:///absolute/path") from None
