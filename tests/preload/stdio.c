/* stdio on a file under the shim's prefix: glibc's stdio does not go through the
 * interposed symbols, so this checks the fopencookie streams. usage: stdio PATH */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *path = argv[1];
    FILE *f = fopen(path, "w+");
    if (!f) { perror("fopen"); return 1; }
    for (int i = 0; i < 2000; i++) fprintf(f, "line %d\n", i);
    if (fputs("last line\n", f) < 0 || fflush(f) != 0) { perror("fputs/fflush"); return 1; }
    long end = ftell(f);
    if (fseek(f, 0, SEEK_SET) != 0) { perror("fseek"); return 1; }
    char line[64];
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    if (lines != 2001 || strcmp(line, "last line\n") != 0) { fprintf(stderr, "read %d lines, last %s", lines, line); return 1; }
    if (fseek(f, 5, SEEK_SET) != 0 || fgetc(f) != '0') { fprintf(stderr, "fseek/fgetc\n"); return 1; }
    if (fclose(f) != 0) { perror("fclose"); return 1; }
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size != end) { fprintf(stderr, "size %ld, ftell said %ld\n", (long)st.st_size, end); return 1; }
    f = fopen(path, "a");
    fwrite("appended\n", 1, 9, f);
    fclose(f);
    f = fopen(path, "rb");
    char buf[16] = {0};
    fseek(f, -9, SEEK_END);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (n != 9 || memcmp(buf, "appended\n", 9) != 0) { fprintf(stderr, "append: read %zu\n", n); return 1; }
    if (fopen("/definitely/missing/file", "r") != NULL) return 1;
    printf("stdio ok: %d lines, %ld bytes\n", lines, end + 9);
    return 0;
}
