"""SageMaker's engine: a launch as a SageMaker training job (the upload, the request, the wait and its logs)."""
