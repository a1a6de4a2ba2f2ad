"""The pipeline's steps, one subpackage per stage in pipeline order: see steps/README.md for the map."""
