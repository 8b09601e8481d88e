"""The experiment driver: the main job (``reproduce``), the heterogeneous benchmark, reports and
seed archives. It runs the substrate's command-line programs (:mod:`opencood_ext.cli`) in-process
and the GenComm method (:mod:`gencomm`) as one of the registered links; neither imports it."""
