"""quest-bench task image-cls: ViT image classification with swappable attention, corruption and adversarial
robustness, attention maps. ``corruptions`` is shared with the segmentation task."""
