"""The one set of fake AWS credentials every test uses (importable because tests/support
is on sys.path). One set, because the fixtures that install them are
session-scoped: two different sets would leave whichever came last in force, and the
rclone server checks credentials."""

ACCESS_KEY = "AKIATENRUNNERTEST01"
SECRET_KEY = "tenRunnerSecretKey0123456789abcdefXYZ"
REGION = "us-east-1"
