"""Pure domain types shared by the cores: errors, plain views, carbon accounting, the HiGHS
wrapper. Sans-IO (a test enforces it for every module outside ``services/runtime``)."""
