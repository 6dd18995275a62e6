"""Quartermaster: a GPU governance plane for Kubernetes (see ARCHITECTURE in docs)."""
