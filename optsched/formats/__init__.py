"""Files in and out: optsched's own versioned JSON formats and importers for
graph files that others published. Nothing else in optsched parses files."""

from .jsonio import (
                     cluster_from_dict,
                     cluster_to_dict,
                     graph_from_dict,
                     graph_to_dict,
                     load_cluster,
                     load_graph,
                     load_schedule,
                     output_folder,
                     read_json,
                     save_cluster,
                     save_graph,
                     save_schedule,
                     schedule_from_dict,
                     schedule_to_dict,
                     schema,
                     write_atomic,
                     write_json,
)

__all__ = ["load_cluster", "load_graph", "load_schedule", "read_json", "save_cluster", "save_graph",
           "save_schedule", "write_json", "graph_to_dict", "graph_from_dict", "cluster_to_dict",
           "cluster_from_dict", "schedule_to_dict", "schedule_from_dict", "schema", "output_folder",
           "write_atomic"]
from .importers import detect_format, example_graph_path, example_names, import_graph  # noqa: F401, E402
