"""det3d's paper preset trains on all of nuScenes' training scenes; only the tuned suites hold some out."""

from quest_det3d import data as D
from quest_det3d.task import Det3dTask


def test_the_paper_preset_trains_on_the_full_train_split():
    paper, tiny = Det3dTask().make_config("paper", {}), Det3dTask().make_config("tiny", {})
    assert paper.dataset == "nuscenes" and not paper.tune_split  # experiment.py then trains on SPLITS' train split
    assert D.SPLITS["v1.0-trainval"][0] == "train"
    assert tiny.tune_split  # the tiny (and tuned) runs keep their validation scenes
