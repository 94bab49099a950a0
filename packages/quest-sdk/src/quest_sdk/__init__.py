"""quest-sdk: what a quest-bench task is built from, without the runner (no Ray).

- ``quest_sdk.task``: the ``Task`` API, ``Resources``, ``TaskOutput`` and the ``RunContext`` a run reports through;
- ``quest_sdk.config``: typed configs whose fields declare their valid values (``param``);
- ``quest_sdk.engine``: the training engine (``Trainer``, ``TrainSpec``), shared by every hand-written task;
- ``quest_sdk.checkpoint`` / ``quest_sdk.tracking``: checkpoints in the run folder; TensorBoard and MLflow;
- ``quest_sdk.robustness`` / ``quest_sdk.image_corruptions``: the corruption vocabulary and image corruptions;
- ``quest_sdk.data``: the cache folder, atomic dataset builds, the data root.
"""
