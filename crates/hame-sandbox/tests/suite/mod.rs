mod docker;
