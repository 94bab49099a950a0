"""quest-bench task image-cls: ViT image classification with swappable attention, corruption and adversarial
robustness, attention maps. The image corruptions (shared with segmentation) are ``quest_sdk.image_corruptions``."""
