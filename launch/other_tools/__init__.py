"""Descriptions for other tools: Kubeflow, ECS and SageMaker manifests, and their schemas."""
